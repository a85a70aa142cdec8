/* A PKCS#11 module that counts logins: it opens SoftHSM2's module
 * (TARGET_MODULE, given with -D when the tests build it), hands out
 * SoftHSM2's function list with C_Login replaced, and forwards every call.
 * Each C_Login appends one line, "LABEL RV", to the file named by
 * KEYFENCE_TEST_LOGIN_LOG: the label of the session's token and the
 * code SoftHSM2 answered. OpenSC's pkcs11-spy, reduced to what the tests
 * of refused PINs count. Built by core/tests/pkcs11_support with
 * `cc -shared -fPIC`; written against PKCS#11 2.40's function list, which
 * is what SoftHSM2 gives through C_GetFunctionList. */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef unsigned long CK_ULONG;
typedef CK_ULONG CK_RV;
typedef struct { unsigned char major, minor; } CK_VERSION;
/* PKCS#11 2.40: the version, then 68 functions, C_Initialize to
 * C_WaitForSlotEvent; C_Login is the 19th. */
#define FUNCTIONS 68
#define C_LOGIN 18
#define C_GET_TOKEN_INFO 6
#define C_GET_SESSION_INFO 15
typedef struct {
    CK_VERSION version;
    void *f[FUNCTIONS];
} CK_FUNCTION_LIST;

typedef CK_RV (*get_function_list_fn)(CK_FUNCTION_LIST **);
typedef CK_RV (*login_fn)(CK_ULONG session, CK_ULONG user, unsigned char *pin, CK_ULONG len);
typedef CK_RV (*session_info_fn)(CK_ULONG session, CK_ULONG *info);
typedef CK_RV (*token_info_fn)(CK_ULONG slot, CK_ULONG *info);

static CK_FUNCTION_LIST *target;
static CK_FUNCTION_LIST list;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static CK_RV loaded = 5; /* CKR_GENERAL_ERROR until the target is open */

static CK_RV counting_login(CK_ULONG session, CK_ULONG user, unsigned char *pin, CK_ULONG len) {
    CK_RV rv = ((login_fn)target->f[C_LOGIN])(session, user, pin, len);
    char label[33] = "?";
    CK_ULONG session_info[4]; /* slotID, state, flags, ulDeviceError */
    CK_ULONG token_info[128]; /* CK_TOKEN_INFO (about 200 bytes) starts with its 32-byte label */
    if (((session_info_fn)target->f[C_GET_SESSION_INFO])(session, session_info) == 0 &&
        ((token_info_fn)target->f[C_GET_TOKEN_INFO])(session_info[0], token_info) == 0) {
        memcpy(label, token_info, 32);
        label[32] = 0;
        for (int i = 31; i >= 0 && label[i] == ' '; i--) label[i] = 0;
    }
    const char *log = getenv("KEYFENCE_TEST_LOGIN_LOG");
    if (log != NULL) {
        char line[96];
        int n = snprintf(line, sizeof line, "%s %lu\n", label, rv);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            if (write(fd, line, (size_t)n) != n) { /* the count is short; the test says so */ }
            close(fd);
        }
    }
    return rv;
}

static void load(void) {
    void *lib = dlopen(TARGET_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return;
    get_function_list_fn get = (get_function_list_fn)dlsym(lib, "C_GetFunctionList");
    if (get == NULL || get(&target) != 0 || target == NULL) return;
    memcpy(&list, target, sizeof list);
    list.f[C_LOGIN] = (void *)counting_login;
    loaded = 0;
}

CK_RV C_GetFunctionList(CK_FUNCTION_LIST **out) {
    pthread_once(&once, load);
    if (loaded != 0) return loaded;
    *out = &list;
    return 0;
}
