// keyfence.h compiles on its own as strict C++11.
#include "keyfence.h"

int keyfence_header_cxx() { return static_cast<int>(KEYFENCE_OK); }
