# ctest: install the built package into a scratch prefix, build tests/consumer against it, run it.
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed")
endif()
# Only public headers are installed, and they include nothing else of ours.
file(GLOB_RECURSE internal ${WORK}/prefix/include/sketchsgd/*.cuh ${WORK}/prefix/include/sketchsgd/*/detail/*)
if(internal)
  message(FATAL_ERROR "internal headers were installed: ${internal}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -DINCLUDE=${WORK}/prefix/include -P ${SOURCE}/tests/public_headers.cmake
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "a public header includes an internal one")
endif()
# The consumer also compiles every installed header on its own (each is self-contained).
file(GLOB_RECURSE headers RELATIVE ${WORK}/prefix/include ${WORK}/prefix/include/sketchsgd/*.hpp)
set(tu "")
foreach(h IN LISTS headers)
  string(APPEND tu "#include <${h}>\n")
endforeach()
file(WRITE ${WORK}/all_headers.cpp "${tu}")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE}/tests/consumer -B ${WORK}/build -G Ninja
                        -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_BUILD_TYPE=Release
                        -DCMAKE_CXX_COMPILER=${CXX} -DALL_HEADERS=${WORK}/all_headers.cpp
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer against the installed package failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed")
endif()
execute_process(COMMAND ${WORK}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer ran but failed")
endif()
# The installed server runs from the prefix with no library path set (its RPATH finds lib/).
if(EXISTS ${WORK}/prefix/bin/sketchsgd-server)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                          ${WORK}/prefix/bin/sketchsgd-server --help
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc OR NOT out MATCHES "checkpoint")
    message(FATAL_ERROR "the installed sketchsgd-server does not run from its prefix: ${out}")
  endif()
  execute_process(COMMAND ldd ${WORK}/prefix/bin/sketchsgd-server OUTPUT_VARIABLE deps)
  if(NOT deps MATCHES "${WORK}/prefix/")
    message(FATAL_ERROR "the installed sketchsgd-server loads another copy of the library:\n${deps}")
  endif()
endif()
# The Python package installed beside the library imports from there (its RPATH finds lib/).
if(PYTHON)
  file(GLOB site ${WORK}/prefix/lib*/python*/site-packages)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${site} ${PYTHON} -c
                          "import sketchsgd, sys; assert sketchsgd.__file__.startswith('${WORK}'), sketchsgd.__file__; print(len(sketchsgd.codecs()), 'codecs')"
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the installed Python package does not import")
  endif()
endif()
