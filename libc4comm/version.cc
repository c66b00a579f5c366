// Anchors libc4comm.so (its content comes from the layer archives) and names the build.
extern "C" const char* c4commBuildInfo() { return "c4comm " __DATE__; }
