# Brings ggml + libllama + llama.cpp's common library (and, with SPECULA_LLAMA_TOOLS, llama.cpp's own
# tools, used as benchmark peers) into the build.
#
# llama.cpp is pinned at v0.5.0. Its only route here is the npm package node-llama-cpp@3.22.1,
# whose llama/gitRelease.bundle is a git bundle of that release. We fetch it with `npm pack`,
# verify the tarball's sha256, and clone the bundle into .deps/ (git-ignored, reused by rebuilds).
# SPECULA_LLAMA_CPP_DIR points at an existing checkout instead.

set(SPECULA_NODE_LLAMA_CPP_VERSION "3.22.1")
set(SPECULA_NODE_LLAMA_CPP_SHA256 "a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f")
set(SPECULA_DEPS_DIR "${PROJECT_SOURCE_DIR}/.deps" CACHE PATH "where fetched dependencies are cached")
set(SPECULA_LLAMA_CPP_DIR "" CACHE PATH "use this llama.cpp checkout instead of fetching the pinned v0.5.0")

function(specula_fetch_llama_cpp out_dir)
  set(src "${SPECULA_DEPS_DIR}/llama.cpp")
  if(EXISTS "${src}/CMakeLists.txt")
    set(${out_dir} "${src}" PARENT_SCOPE)
    return()
  endif()
  file(MAKE_DIRECTORY "${SPECULA_DEPS_DIR}")
  set(tgz "${SPECULA_DEPS_DIR}/node-llama-cpp-${SPECULA_NODE_LLAMA_CPP_VERSION}.tgz")
  if(NOT EXISTS "${tgz}")
    find_program(NPM npm REQUIRED)
    message(STATUS "specula: fetching node-llama-cpp@${SPECULA_NODE_LLAMA_CPP_VERSION} (llama.cpp v0.5.0 bundle) with npm pack")
    execute_process(COMMAND "${NPM}" pack "node-llama-cpp@${SPECULA_NODE_LLAMA_CPP_VERSION}" --silent
                    WORKING_DIRECTORY "${SPECULA_DEPS_DIR}" RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT EXISTS "${tgz}")
      message(FATAL_ERROR "specula: npm pack node-llama-cpp@${SPECULA_NODE_LLAMA_CPP_VERSION} failed (rc=${rc})")
    endif()
  endif()
  file(SHA256 "${tgz}" sha)
  if(NOT sha STREQUAL SPECULA_NODE_LLAMA_CPP_SHA256)
    file(REMOVE "${tgz}")
    message(FATAL_ERROR "specula: ${tgz} has sha256 ${sha}, expected ${SPECULA_NODE_LLAMA_CPP_SHA256}; removed it")
  endif()
  set(unpack "${SPECULA_DEPS_DIR}/node-llama-cpp")
  file(REMOVE_RECURSE "${unpack}")
  file(MAKE_DIRECTORY "${unpack}")
  execute_process(COMMAND tar xzf "${tgz}" -C "${unpack}" package/llama/gitRelease.bundle RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "specula: could not extract llama/gitRelease.bundle from ${tgz}")
  endif()
  find_package(Git REQUIRED)
  execute_process(COMMAND "${GIT_EXECUTABLE}" -c advice.detachedHead=false clone --quiet
                          "${unpack}/package/llama/gitRelease.bundle" "${src}.tmp"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "specula: git clone of the llama.cpp bundle failed")
  endif()
  file(RENAME "${src}.tmp" "${src}")
  file(REMOVE_RECURSE "${unpack}")
  set(${out_dir} "${src}" PARENT_SCOPE)
endfunction()

if(SPECULA_LLAMA_CPP_DIR)
  if(NOT EXISTS "${SPECULA_LLAMA_CPP_DIR}/CMakeLists.txt")
    message(FATAL_ERROR "specula: SPECULA_LLAMA_CPP_DIR=${SPECULA_LLAMA_CPP_DIR} is not a llama.cpp checkout")
  endif()
  set(LLAMA_CPP_SOURCE_DIR "${SPECULA_LLAMA_CPP_DIR}")
else()
  specula_fetch_llama_cpp(LLAMA_CPP_SOURCE_DIR)
endif()
message(STATUS "specula: llama.cpp source at ${LLAMA_CPP_SOURCE_DIR}")

# ggml's AMX int8 path dies with SIGILL under GCC 12 + GGML_NATIVE on AMX CPUs (GCC drops the
# tile-config stores). Keeping AMX instructions out of the native ISA avoids it without patching ggml.
include(CheckCCompilerFlag)
check_c_compiler_flag("-mno-amx-tile" SPECULA_HAS_MNO_AMX)
if(SPECULA_HAS_MNO_AMX)
  string(APPEND CMAKE_C_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  string(APPEND CMAKE_CXX_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
endif()

set(BUILD_SHARED_LIBS OFF CACHE BOOL "" FORCE)
# ggml's RPC backend: `--device RPC[host:port]` runs the model on an rpc-server (tests/test_rpc.cpp).
# Not in the demo's build (SPECULA_DEMO_BUILD, CMakeLists.txt), which runs on the local CPU; a
# configuration without the demo's options (scripts/build.sh's) has it again as SPECULA_RPC says.
option(SPECULA_RPC "build ggml's RPC backend and its rpc-server" ON)
set(specula_rpc ${SPECULA_RPC})
if(SPECULA_DEMO_BUILD)
  set(specula_rpc OFF)
endif()
set(GGML_RPC ${specula_rpc} CACHE BOOL "" FORCE)
set(GGML_NATIVE ON CACHE BOOL "")
# specula links libllama and llama.cpp's common library (its chat layer, Jinja engine, cpp-httplib).
set(LLAMA_BUILD_COMMON ON CACHE BOOL "" FORCE)
# llama.cpp's tools and examples are the benchmark peers; scripts/demo.sh configures without them.
option(SPECULA_LLAMA_TOOLS "configure llama.cpp's tools and examples, the benchmark peers (target peers)" ON)
set(LLAMA_BUILD_TOOLS ${SPECULA_LLAMA_TOOLS} CACHE BOOL "" FORCE)
set(LLAMA_BUILD_EXAMPLES ${SPECULA_LLAMA_TOOLS} CACHE BOOL "" FORCE)
set(LLAMA_BUILD_SERVER ${SPECULA_LLAMA_TOOLS} CACHE BOOL "" FORCE)
set(LLAMA_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_APP OFF CACHE BOOL "" FORCE)
set(LLAMA_USE_PREBUILT_UI OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_UI OFF CACHE BOOL "" FORCE)
set(LLAMA_OPENSSL OFF CACHE BOOL "" FORCE)
set(LLAMA_CURL OFF CACHE BOOL "" FORCE)

# EXCLUDE_FROM_ALL: only what specula links (ggml, llama) and the peer tools it asks for get built.
add_subdirectory("${LLAMA_CPP_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/llama.cpp" EXCLUDE_FROM_ALL)
# Without llama.cpp's tools, the common library is specula's alone, and specula links only its chat
# layer (chat.cpp, its parsers, the Jinja engine, json-schema-to-grammar) and what those reach
# (common.cpp and through it sampling, speculative, fit, ngram-*, log). The files nothing of that
# calls are left out of the build: the command-line parser arg.cpp (the slowest file of the whole
# build to compile), the model downloader and its cache (download, hf-cache, preset), console,
# debug, imatrix-loader, subproc. The linker drops them from every specula binary anyway: the
# binaries are the same. With the tools (the peers use all of it) the library stays whole.
if(NOT SPECULA_LLAMA_TOOLS)
  set(specula_common_unused arg.cpp console.cpp debug.cpp download.cpp hf-cache.cpp imatrix-loader.cpp
      preset.cpp subproc.cpp)
  get_target_property(specula_common_sources llama-common SOURCES)
  foreach(unused ${specula_common_unused})
    if(NOT "${unused}" IN_LIST specula_common_sources)
      message(FATAL_ERROR "specula: llama.cpp's common library has no ${unused} to leave out (cmake/LlamaCpp.cmake)")
    endif()
  endforeach()
  list(REMOVE_ITEM specula_common_sources ${specula_common_unused})
  set_property(TARGET llama-common PROPERTY SOURCES ${specula_common_sources})
endif()

# SPECULA_FAST_BUILD (CMakeLists.txt): what of llama.cpp specula runs once per model or request, at
# -O1: libllama's model loading (specula loads a vocabulary through it), its chat templates and
# adapters; without the tools (the peers keep theirs at -O3) also cpp-httplib and the common library
# (chat templates, their parsers, JSON-schema grammars). libllama's tokenizer, grammar, graph and KV
# cache (the LlamaPeer oracle decodes with them), ggml and ggml-cpu stay at -O3.
if(SPECULA_FAST_BUILD AND CMAKE_BUILD_TYPE STREQUAL "Release")
  set(specula_llama_cold)
  foreach(f llama-model-loader.cpp llama-model.cpp llama-chat.cpp llama-adapter.cpp llama-model-saver.cpp)
    if(NOT EXISTS "${LLAMA_CPP_SOURCE_DIR}/src/${f}")
      message(FATAL_ERROR "specula: llama.cpp has no src/${f} (cmake/LlamaCpp.cmake)")
    endif()
    list(APPEND specula_llama_cold "${LLAMA_CPP_SOURCE_DIR}/src/${f}")
  endforeach()
  if(NOT SPECULA_DEMO_BUILD)
    set_property(SOURCE ${specula_llama_cold} DIRECTORY "${LLAMA_CPP_SOURCE_DIR}/src" APPEND PROPERTY COMPILE_OPTIONS -O1)
  endif()
  if(NOT SPECULA_LLAMA_TOOLS)
    target_compile_options(cpp-httplib PRIVATE -O1)
    target_compile_options(llama-common PRIVATE $<IF:$<BOOL:${SPECULA_DEMO_BUILD}>,-O0,-O1>)
  endif()
endif()

# SPECULA_DEMO_BUILD (CMakeLists.txt: scripts/demo.sh's first build, where nothing decodes with
# libllama: no tests and their LlamaPeer oracle, no benchmarks, no llama.cpp tools). specula runs of
# libllama its vocabulary (loaded once, the tokenizer, a token's text per generated token) and its
# grammar stacks (per token under a grammar): llama-vocab, unicode and llama-grammar at -O1, whose
# calls per token take microseconds beside a forward pass's milliseconds, and which -O3 takes half
# as long again to compile (unicode's regular expressions most). The rest, the model builders,
# graph, KV caches, context, sampler, quantizer and loader, runs never or once per model: at -O0, in unity batches as llama.cpp builds its model builders (the
# headers, most of a file's time at -O0, are then parsed once per batch). The common library, the
# chat layer specula calls once per request, the same; without its downloader (left out above)
# nothing of it uses cpp-httplib, which is then not built. Both take less than half the compiler's
# time they take at -O3 (libllama) and -O1 (the common library) file by file.
if(SPECULA_DEMO_BUILD)
  set(specula_llama_hot llama-grammar.cpp llama-vocab.cpp unicode.cpp)
  get_target_property(specula_llama_sources llama SOURCES)
  foreach(f ${specula_llama_hot})
    if(NOT "${f}" IN_LIST specula_llama_sources)
      message(FATAL_ERROR "specula: libllama has no ${f} to keep at -O1 (cmake/LlamaCpp.cmake)")
    endif()
  endforeach()
  target_compile_options(llama PRIVATE -O0)
  # Sources with their own COMPILE_OPTIONS stay out of the unity batches. The batches: the core
  # files (before the model builders) in batches of llama.cpp's 16, the model builders in batches
  # of 50, as a model builder takes little more at -O0 than the headers every batch parses again.
  set_target_properties(llama PROPERTIES UNITY_BUILD_MODE GROUP)
  set(specula_core_n 0)
  set(specula_models_n 0)
  foreach(f ${specula_llama_sources})
    if(NOT f MATCHES "\\.cpp$")
      continue()
    endif()
    cmake_path(ABSOLUTE_PATH f BASE_DIRECTORY "${LLAMA_CPP_SOURCE_DIR}/src" OUTPUT_VARIABLE path)
    if("${f}" IN_LIST specula_llama_hot)
      set_property(SOURCE "${path}" DIRECTORY "${LLAMA_CPP_SOURCE_DIR}/src" PROPERTY COMPILE_OPTIONS -O1)
    else()
      if(path MATCHES "/src/models/[^/]+\\.cpp$")
        math(EXPR batch "${specula_models_n} / 50")
        set(group "models_${batch}")
        math(EXPR specula_models_n "${specula_models_n} + 1")
      else()
        math(EXPR batch "${specula_core_n} / 16")
        set(group "core_${batch}")
        math(EXPR specula_core_n "${specula_core_n} + 1")
      endif()
      set_property(SOURCE "${path}" DIRECTORY "${LLAMA_CPP_SOURCE_DIR}/src" PROPERTY SKIP_UNITY_BUILD_INCLUSION OFF)
      set_property(SOURCE "${path}" DIRECTORY "${LLAMA_CPP_SOURCE_DIR}/src" PROPERTY UNITY_GROUP "${group}")
    endif()
  endforeach()
  # Batches of 27 files: the chat layer's files, its model-specific parsers and the common library's
  # core share most of their templates (nlohmann/json, the PEG parser), instantiated once then; the
  # rest (sampling, n-grams, the Jinja engine) in a second batch.
  set_target_properties(llama-common PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 27)
  # json.cpp's own ordered_json (common_json) clashes with the other files' alias of nlohmann's.
  if(NOT EXISTS "${LLAMA_CPP_SOURCE_DIR}/common/json.cpp")
    message(FATAL_ERROR "specula: llama.cpp has no common/json.cpp (cmake/LlamaCpp.cmake)")
  endif()
  set_property(SOURCE "${LLAMA_CPP_SOURCE_DIR}/common/json.cpp" DIRECTORY "${LLAMA_CPP_SOURCE_DIR}/common" PROPERTY SKIP_UNITY_BUILD_INCLUSION ON)
  get_target_property(specula_common_links llama-common LINK_LIBRARIES)
  if(NOT "cpp-httplib" IN_LIST specula_common_links)
    message(FATAL_ERROR "specula: llama.cpp's common library no longer links cpp-httplib (cmake/LlamaCpp.cmake)")
  endif()
  list(REMOVE_ITEM specula_common_links cpp-httplib)
  set_property(TARGET llama-common PROPERTY LINK_LIBRARIES ${specula_common_links})
  get_target_property(specula_common_iface llama-common INTERFACE_LINK_LIBRARIES)
  list(REMOVE_ITEM specula_common_iface "$<LINK_ONLY:cpp-httplib>")
  set_property(TARGET llama-common PROPERTY INTERFACE_LINK_LIBRARIES ${specula_common_iface})
endif()

# The rpc-server (target ggml-rpc-server, which test_rpc starts) is one of llama.cpp's tools: without
# the others, its folder alone.
if(specula_rpc AND NOT SPECULA_LLAMA_TOOLS)
  add_subdirectory("${LLAMA_CPP_SOURCE_DIR}/tools/rpc" "${CMAKE_BINARY_DIR}/llama.cpp/tools/rpc" EXCLUDE_FROM_ALL)
endif()

# Peer binaries for benchmarks: `cmake --build build --target peers` (llama-quantize makes Q4_K_M bench twins).
if(SPECULA_LLAMA_TOOLS)
  set(SPECULA_PEER_TARGETS llama-bench llama-completion llama-speculative-simple llama-server llama-tokenize llama-quantize)
  add_custom_target(peers DEPENDS ${SPECULA_PEER_TARGETS})
else()
  add_custom_target(peers COMMAND ${CMAKE_COMMAND} -E echo "specula: the peers need llama.cpp's tools: configure with -DSPECULA_LLAMA_TOOLS=ON"
                          COMMAND ${CMAKE_COMMAND} -E false)
endif()
