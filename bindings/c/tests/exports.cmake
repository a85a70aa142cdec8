# Fails unless every global symbol LIB defines starts with keyfence_, so
# that a server linking OpenSSL (or BoringSSL, or AWS-LC) beside it is safe.
# LIB is the shared library (its dynamic symbols) or, with -DSTATIC=ON, the
# static one (its global symbols), with no exception: AWS-LC defines no
# GNU unique symbol (`u`, which objcopy cannot make local; BoringSSL had
# two).
if(STATIC)
  execute_process(COMMAND nm -g --defined-only "${LIB}" OUTPUT_VARIABLE out RESULT_VARIABLE rc)
else()
  execute_process(COMMAND nm -D --defined-only "${LIB}" OUTPUT_VARIABLE out RESULT_VARIABLE rc)
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIB}")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-f]+ ([A-Za-z]) (.+)$")
    set(kind "${CMAKE_MATCH_1}")
    set(sym "${CMAKE_MATCH_2}")
    if(NOT sym MATCHES "^keyfence_")
      message(FATAL_ERROR "${LIB} exports ${sym} (${kind})")
    endif()
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count LESS 40)
  message(FATAL_ERROR "${LIB} defines only ${count} keyfence_* symbols")
endif()
message(STATUS "${LIB} exports ${count} symbols, all keyfence_*")
