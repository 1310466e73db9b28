# Write a C++ source holding the bytes of IN as `NAME` (cmake -DIN= -DOUT= -DNAME= -P embed.cmake).
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}" "// Generated from ${IN}\n#include <cstddef>\nnamespace metrale::embedded {\n"
     "alignas(64) extern const unsigned char ${NAME}[] = {${bytes}};\n"
     "extern const std::size_t ${NAME}_size = sizeof(${NAME});\n}\n")
