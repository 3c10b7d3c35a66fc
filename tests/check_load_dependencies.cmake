# SPDX-License-Identifier: Apache-2.0
# ctest library_load_dependencies: what the dynamic loader does with the built files.
#
# 1. libpooler.so must load on a machine without a CUDA driver and report
#    POOLER_NO_DRIVER, so the driver (and NVRTC, opened at run time like it)
#    must not be among its load-time dependencies (DT_NEEDED). Linkers differ
#    on whether an unused library on the link line is dropped (GNU ld's
#    --as-needed default on some distributions), so this reads the built file
#    rather than trusting the link line.
# 2. No RUNPATH or RPATH element of the library or of any of BINARIES (the
#    tools, the tests) may be empty or relative: the loader reads an empty
#    element ("/usr/local/cuda/lib:") and a relative one as the current
#    directory, so a libcrypto.so.3 planted there would run at load. Absolute
#    folders and $ORIGIN are the only elements allowed.
#
#   cmake -DREADELF=readelf -DLIBRARY=libpooler.so [-DBINARIES=a;b] -P check_load_dependencies.cmake
cmake_minimum_required(VERSION 3.25)
foreach(variable READELF LIBRARY)
  if(NOT DEFINED ${variable} OR "${${variable}}" STREQUAL "")
    message(FATAL_ERROR "check_load_dependencies: pass -D${variable}=...")
  endif()
endforeach()

# Sets <out> to the lines of `readelf -d <file>`.
function(dynamic_section file out)
  execute_process(COMMAND ${READELF} -d ${file} OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${READELF} -d ${file} failed (${result}): ${errors}")
  endif()
  if(NOT listing MATCHES "\\(NEEDED\\)")
    message(FATAL_ERROR "no NEEDED entries read from ${READELF} -d ${file}: the output format changed?\n${listing}")
  endif()
  string(REPLACE "\n" ";" lines "${listing}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

set(bad_paths)
set(checked 0)
foreach(file IN LISTS LIBRARY BINARIES)
  dynamic_section(${file} lines)
  math(EXPR checked "${checked} + 1")
  foreach(line IN LISTS lines)
    # "Library runpath: [a:b]" / "Library rpath: [a:b]"; an empty value is one empty element.
    if(line MATCHES "\\((RUNPATH|RPATH)\\)[^[]*\\[([^]]*)\\]")
      set(tag ${CMAKE_MATCH_1})
      set(value "${CMAKE_MATCH_2}")
      # Elements one by one, empty ones included (a CMake list drops none of
      # them when built by hand like this: "a::b" gives a, "", b).
      set(rest "${value}")
      while(TRUE)
        string(FIND "${rest}" ":" colon)
        if(colon EQUAL -1)
          set(element "${rest}")
        else()
          string(SUBSTRING "${rest}" 0 ${colon} element)
          math(EXPR after "${colon} + 1")
          string(SUBSTRING "${rest}" ${after} -1 rest)
        endif()
        if(element STREQUAL "")
          list(APPEND bad_paths "${file}: ${tag} [${value}] has an empty element (the current directory)")
        elseif(NOT element MATCHES "^/" AND NOT element MATCHES "^\\$(ORIGIN|{ORIGIN})(/|$)")
          list(APPEND bad_paths "${file}: ${tag} [${value}] has the relative element '${element}'")
        endif()
        if(colon EQUAL -1)
          break()
        endif()
      endwhile()
    endif()
  endforeach()
endforeach()
if(bad_paths)
  list(JOIN bad_paths "\n  " bad_text)
  message(FATAL_ERROR "library search paths that reach the current directory (every element must be an "
                      "absolute folder or $ORIGIN):\n  ${bad_text}")
endif()
message(STATUS "RUNPATH/RPATH of ${checked} files: every element absolute or $ORIGIN")

dynamic_section(${LIBRARY} lines)
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
list(JOIN needed ", " needed_text)
if(forbidden)
  list(JOIN forbidden ", " forbidden_text)
  message(FATAL_ERROR "${LIBRARY} needs ${forbidden_text} at load time (NEEDED: ${needed_text}); the CUDA driver "
                      "and NVRTC must be opened with dlopen so that the library loads without them")
endif()
message(STATUS "load-time dependencies of ${LIBRARY}: ${needed_text}")
