# Asks rustc which system libraries the static library needs and compares
# them with what the CMake package and keyfence.pc declare.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env CARGO_TARGET_DIR=${CARGO_TARGET_DIR}
          ${CARGO} rustc --locked --manifest-path ${SOURCE_DIR}/Cargo.toml -p keyfence-c --lib --crate-type staticlib --profile ${PROFILE}
          -- --print native-static-libs
  ERROR_VARIABLE err OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cargo rustc failed:\n${err}")
endif()
if(NOT "${err}${out}" MATCHES "native-static-libs: ([^\n]*)")
  message(FATAL_ERROR "rustc printed no native-static-libs line:\n${err}")
endif()
string(STRIP "${CMAKE_MATCH_1}" printed)
string(REPLACE "-l" "" printed "${printed}")
separate_arguments(printed UNIX_COMMAND "${printed}")
if(NOT "${printed}" STREQUAL "${EXPECTED}")
  message(FATAL_ERROR "rustc says the static library needs '${printed}', CMakeLists.txt declares '${EXPECTED}'")
endif()
message(STATUS "native static libs agree: ${printed}")
