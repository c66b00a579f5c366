# Fails listing every C++ source that clang-format would change.
file(GLOB_RECURSE files RELATIVE ${SRC}
     ${SRC}/include/*.hpp ${SRC}/include/*.h ${SRC}/common/*.cc ${SRC}/common/*.hpp ${SRC}/libc4comm/*.cc ${SRC}/libc4comm/*.hpp
     ${SRC}/kernels/*.cc ${SRC}/kernels/*.hpp ${SRC}/kernels/*.inc ${SRC}/kernels/*.cu ${SRC}/kernels/*.cuh
     ${SRC}/transports/*.cc ${SRC}/transports/*.hpp ${SRC}/bindings/*.cc ${SRC}/bindings/*.hpp
     ${SRC}/tests/*.cc ${SRC}/tests/*.hpp ${SRC}/bench/*.cc ${SRC}/bench/*.hpp ${SRC}/tools/*.cc ${SRC}/tools/*.hpp)
set(bad "")
foreach(f ${files})
  execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${SRC}/${f} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND bad ${f})
  endif()
endforeach()
list(LENGTH files n)
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "clang-format would change these files (run clang-format -i on them):\n  ${bad}")
endif()
message(STATUS "clang-format: ${n} files clean")
