"""llama.cpp backend for Kronk.

Importing the package chooses llama.cpp's libraries and pins the C++ runtime (see
`native`) before any of its modules imports llama_cpp.
"""

from kronk_llamacpp import native

native.prepare()
