# The etcd store test: starts a three-member cluster on loopback with
# vectors/etcd-fixture.sh in a fresh directory, runs the C program on an
# etcd:// store name, and kills the members (by process group) whatever
# happened. Without etcd it prints SKIPPED (SKIP_REGULAR_EXPRESSION).
include("${CMAKE_CURRENT_LIST_DIR}/fixture.cmake")
kf_fixture(etcd-fixture.sh etcd)
file(READ "${WORK}/endpoints" endpoints)
string(STRIP "${endpoints}" endpoints)
execute_process(COMMAND "${TEST}" "etcd://${endpoints}/c-test" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(STRINGS "${WORK}/pids" groups)
foreach(g IN LISTS groups)
  execute_process(COMMAND kill -9 -- -${g} ERROR_QUIET)
endforeach()
kf_verdict()
