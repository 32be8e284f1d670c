# cmake -DDIR=<dir> -P check_no_files.cmake: fails when <dir> holds anything (the fuzz replays'
# input files, which each process removes at exit).
file(GLOB leftovers "${DIR}/*")
if(leftovers)
  message(FATAL_ERROR "files left in ${DIR}: ${leftovers}")
endif()
