# Writes INPUT's bytes, with the line <!--SPECULA_TOKENS--> replaced by TOKENS (the token colours
# both pages share), as the C++ array NAME into OUTPUT (cmake -P; no compiler extension like #embed needed).
file(READ ${INPUT} content)
file(READ ${TOKENS} tokens)
string(REPLACE "<!--SPECULA_TOKENS-->\n" "${tokens}" content "${content}")
file(WRITE ${OUTPUT}.html "${content}")
file(READ ${OUTPUT}.html content HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," content "${content}")
get_filename_component(name ${INPUT} NAME)
file(WRITE ${OUTPUT} "#pragma once\n// Generated at build time from ${name}; edit that file.\ninline constexpr unsigned char ${NAME}[] = {${content}};\n")
