# Bootstrap sources (owned by the bootstrap): include() this fragment and add ${C4_BOOTSTRAP_SOURCES}
# to a target that links c4_common and Threads.
set(C4_BOOTSTRAP_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/bootstrap.cc
    ${CMAKE_CURRENT_LIST_DIR}/bootstrap_wire.cc
    ${CMAKE_CURRENT_LIST_DIR}/host_id.cc
    ${CMAKE_CURRENT_LIST_DIR}/launch_env.cc)
