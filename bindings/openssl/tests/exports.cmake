# Fails unless the provider module defines exactly one dynamic symbol,
# OSSL_provider_init: nothing of it (and nothing of the BoringSSL inside
# libkeyfence, which exports only keyfence_*) can take the place of a
# symbol of the server's OpenSSL.
execute_process(COMMAND nm -D --defined-only "${LIB}" OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIB}")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(syms "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-f]+ [A-Za-z] (.+)$")
    list(APPEND syms "${CMAKE_MATCH_1}")
  endif()
endforeach()
if(NOT syms STREQUAL "OSSL_provider_init")
  message(FATAL_ERROR "${LIB} exports ${syms}, not just OSSL_provider_init")
endif()
