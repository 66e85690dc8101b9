# Included into llama.cpp's own CMake project when llama-cpp-python is built (`make install` passes
# -DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file> in CMAKE_ARGS). llama-cpp-python forces LLAMA_BUILD_COMMON on, which
# builds libllama-common (argument parsing, chat templates, downloads over HTTPS) for llama.cpp's command-line
# programs; the Python bindings never load it. A normal variable shadows the forced cache entry in llama.cpp's
# directory, so that library is not compiled. The libraries the bindings load (llama, ggml, ggml-base, ggml-cpu) are
# compiled with the same flags either way.
set(LLAMA_BUILD_COMMON OFF)
