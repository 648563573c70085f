# Turns a file into a C array: cmake -DIN=file -DOUT=file.c -DNAME=symbol [-DBINARY=ON] -P embed.cmake
# Text ends in a 0 byte; a binary file's array is exactly its bytes, NAME_size their count.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR size "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
if(BINARY)
  file(WRITE "${OUT}" "/* Generated from ${IN} by cmake/embed.cmake. */\n#include <stddef.h>\n"
                      "extern const unsigned char ${NAME}[];\nextern const size_t ${NAME}_size;\n"
                      "const unsigned char ${NAME}[] = {\n${bytes}0};\nconst size_t ${NAME}_size = ${size};\n")
else()
  file(WRITE "${OUT}" "/* Generated from ${IN} by cmake/embed.cmake. */\nconst char ${NAME}[] = {\n${bytes}0};\n")
endif()
