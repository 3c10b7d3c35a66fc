# SPDX-License-Identifier: Apache-2.0
# ctest c_api_exports: the dynamic symbols libpooler.so defines are every C
# function that include/pooler/pooler.h declares, the C++ API of namespace
# pooler (the Pooler and the exception types an engine catches), and nothing
# else: above all nothing of spdlog or fmt, which an engine's process may hold
# in other versions.
#
#   cmake -DNM=nm -DLIBRARY=libpooler.so -DHEADER=include/pooler/pooler.h -P check_c_api_symbols.cmake
foreach(variable NM LIBRARY HEADER)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "check_c_api_symbols: pass -D${variable}=...")
  endif()
endforeach()

execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${result}): ${errors}")
endif()

string(REPLACE "\n" ";" lines "${listing}")
set(exported)
set(leaked)
set(foreign)
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] +([^ ]+)$")
    set(name ${CMAKE_MATCH_1})
    list(APPEND exported ${name})
    if(name MATCHES "spdlog|fmt")
      list(APPEND leaked ${name})
    elseif(NOT name MATCHES "^(pooler_[a-z0-9_]+|_ZN6pooler.*|_ZNK6pooler.*|_ZT[ISV]N6pooler.*)$")
      list(APPEND foreign ${name})
    endif()
  endif()
endforeach()

# Every function the header declares (one "POOLER_C_API <type> pooler_name(" per declaration).
file(READ ${HEADER} header)
string(REGEX MATCHALL "\nPOOLER_C_API [^(\n]*[ *]pooler_[a-z0-9_]+\\(" declarations "${header}")
set(missing)
set(declared 0)
foreach(declaration IN LISTS declarations)
  string(REGEX REPLACE ".*[ *](pooler_[a-z0-9_]+)\\($" "\\1" function "${declaration}")
  math(EXPR declared "${declared} + 1")
  list(FIND exported ${function} index)
  if(index EQUAL -1)
    list(APPEND missing ${function})
  endif()
endforeach()

# Functions added to ABI 4 without a new ABI version (adding a function is compatible):
# named here too, so that a declaration the pattern above misses still fails the check.
foreach(added pooler_set_log_callback pooler_log)
  list(FIND exported ${added} index)
  if(index EQUAL -1)
    list(APPEND missing ${added})
  endif()
  if(NOT header MATCHES "\nPOOLER_C_API [^(\n]*[ *]${added}\\(")
    list(APPEND missing "${added} (not declared in ${HEADER})")
  endif()
endforeach()

# The C++ API an engine links against and catches.
foreach(cxx _ZN6pooler6PoolerC1EP8ncclCommNS_13PoolerOptionsE _ZN6pooler6Pooler3runEiRKNS_10TensorViewEP11CUstream_st
            _ZTIN6pooler5ErrorE _ZTIN6pooler15InvalidArgumentE _ZTIN6pooler11PeerTimeoutE
            _ZN6pooler18abort_communicatorEP8ncclComm pooler_comm_abort)
  list(FIND exported ${cxx} index)
  if(index EQUAL -1)
    list(APPEND missing ${cxx})
  endif()
endforeach()

list(LENGTH exported count)
message(STATUS "${LIBRARY}: ${count} dynamic symbols defined; ${declared} C functions declared in ${HEADER}")
set(problems "")
if(declared LESS 20)
  string(APPEND problems "only ${declared} declarations found in ${HEADER}: the pattern no longer matches it\n")
endif()
if(leaked)
  string(REPLACE ";" "\n  " leaked "${leaked}")
  string(APPEND problems "spdlog/fmt symbols exported:\n  ${leaked}\n")
endif()
if(foreign)
  string(REPLACE ";" "\n  " foreign "${foreign}")
  string(APPEND problems "symbols outside the C functions and namespace pooler exported:\n  ${foreign}\n")
endif()
if(missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  string(APPEND problems "API symbols not exported:\n  ${missing}\n")
endif()
if(problems)
  message(FATAL_ERROR "${problems}")
endif()
message(STATUS "ok: every C function exported, the C++ API exported, nothing of spdlog or fmt")
