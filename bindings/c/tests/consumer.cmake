# Installs keyfence into a scratch prefix and builds a separate project
# against it twice: with find_package(keyfence) (shared and static), and
# with a plain compiler command from pkg-config.
file(REMOVE_RECURSE "${WORK}")
set(prefix "${WORK}/prefix")

include("${CMAKE_CURRENT_LIST_DIR}/run.cmake")

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK}/cmake" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${prefix}")
run(${CMAKE_COMMAND} --build "${WORK}/cmake")
run("${WORK}/cmake/consumer_shared")
run("${WORK}/cmake/consumer_static")

find_program(PKG_CONFIG pkg-config REQUIRED)
find_program(CC NAMES cc gcc clang REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs keyfence OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not find keyfence in ${prefix}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c99 -Wall -Wextra -Werror -pedantic "${SOURCE_DIR}/consumer.c" ${flags} "-Wl,-rpath,${prefix}/lib" -o "${WORK}/consumer_pkg_config")
run("${WORK}/consumer_pkg_config")
execute_process(COMMAND ${PKG_CONFIG} --static --libs keyfence OUTPUT_VARIABLE sflags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
separate_arguments(sflags UNIX_COMMAND "${sflags}")
run(${CC} -std=c99 "${SOURCE_DIR}/consumer.c" -I "${prefix}/include" "${prefix}/lib/libkeyfence.a" ${sflags} -o "${WORK}/consumer_pkg_config_static")
run("${WORK}/consumer_pkg_config_static")
message(STATUS "the installed package builds and runs from CMake and pkg-config")
