# find_package(cc1d CONFIG): the imported target cc1d::cc1d (static libcc1d and
# its headers; links libdl and threads; loads CUDA/HIP, NVRTC/hipRTC and SQLite
# at run time, so a program needs none of them to build).
include(CMakeFindDependencyMacro)
find_dependency(Threads)
include("${CMAKE_CURRENT_LIST_DIR}/cc1dTargets.cmake")
