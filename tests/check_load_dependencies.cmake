# ctest library_load_dependencies: libpooler.so must load on a machine without
# a CUDA driver and report POOLER_NO_DRIVER, so the driver (and NVRTC, opened
# at run time like it) must not be among its load-time dependencies (DT_NEEDED).
# Linkers differ on whether an unused library on the link line is dropped
# (GNU ld's --as-needed default on some distributions), so this reads the
# built file rather than trusting the link line.
#
#   cmake -DREADELF=readelf -DLIBRARY=libpooler.so -P check_load_dependencies.cmake
foreach(variable READELF LIBRARY)
  if(NOT DEFINED ${variable} OR "${${variable}}" STREQUAL "")
    message(FATAL_ERROR "check_load_dependencies: pass -D${variable}=...")
  endif()
endforeach()

execute_process(COMMAND ${READELF} -d ${LIBRARY} OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${LIBRARY} failed (${result}): ${errors}")
endif()

string(REPLACE "\n" ";" lines "${listing}")
set(needed)
set(forbidden)
foreach(line IN LISTS lines)
  if(line MATCHES "\\(NEEDED\\)[^[]*\\[([^]]+)\\]")
    set(library_name ${CMAKE_MATCH_1})
    list(APPEND needed ${library_name})
    if(library_name MATCHES "^lib(cuda|nvrtc)[.-]")
      list(APPEND forbidden ${library_name})
    endif()
  endif()
endforeach()

if(NOT needed)
  message(FATAL_ERROR "no NEEDED entries read from ${READELF} -d ${LIBRARY}: the output format changed?\n${listing}")
endif()
list(JOIN needed ", " needed_text)
if(forbidden)
  list(JOIN forbidden ", " forbidden_text)
  message(FATAL_ERROR "${LIBRARY} needs ${forbidden_text} at load time (NEEDED: ${needed_text}); the CUDA driver "
                      "and NVRTC must be opened with dlopen so that the library loads without them")
endif()
message(STATUS "load-time dependencies of ${LIBRARY}: ${needed_text}")
