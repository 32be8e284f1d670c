# Writes INPUT's bytes as a C++ array into OUTPUT (cmake -P; no compiler extension like #embed needed).
file(READ ${INPUT} content HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," content "${content}")
get_filename_component(name ${INPUT} NAME)
file(WRITE ${OUTPUT} "#pragma once\n// Generated at build time from ${name}; edit that file.\ninline constexpr unsigned char kReportTemplate[] = {${content}};\n")
