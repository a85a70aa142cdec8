# The program in docs/c.md is bindings/c/examples/example.c, byte for byte.
file(READ "${DOC}" doc)
file(READ "${EXAMPLE}" example)
string(FIND "${doc}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "docs/c.md's complete program differs from ${EXAMPLE}: update one from the other")
endif()
