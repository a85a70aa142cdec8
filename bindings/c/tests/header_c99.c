/* keyfence.h compiles on its own as strict C99. */
#include "keyfence.h"

int keyfence_header_c99(void) { return (int)KEYFENCE_OK; }
