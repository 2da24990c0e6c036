/* The client side of tests/fake_mps/nvidia-cuda-mps-control, compiled by tests/conftest.py
 * where a C compiler is (else the Python script does both sides). MPS tests run the control
 * program for every command, hundreds of times a suite: a Python start costs ~10 ms, this ~1.
 *
 * Without arguments: read one command line from stdin, send it to the daemon on
 * $CUDA_MPS_PIPE_DIRECTORY/control, print the answer, exit 0; no daemon: the real program's
 * sentence and exit 1. With -d: exec the Python fake (FAKE_PYTHON FAKE_SCRIPT -d), the daemon.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int run_daemon(void) {
    execl(FAKE_PYTHON, FAKE_PYTHON, "-IS", FAKE_SCRIPT, "-d", (char *)NULL);
    perror("exec " FAKE_PYTHON);
    return 127;
}

static int write_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n <= 0) {
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "-d") == 0) {
        return run_daemon();
    }
    char line[4096];
    if (fgets(line, sizeof line - 1, stdin) == NULL) {
        line[0] = '\0';
    }
    size_t len = strlen(line);
    if (len == 0 || line[len - 1] != '\n') {
        line[len++] = '\n';
        line[len] = '\0';
    }
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int path_len = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control",
                            pipe_dir ? pipe_dir : "/tmp/nvidia-mps");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (path_len < 0 || (size_t)path_len >= sizeof addr.sun_path || fd < 0 ||
        connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        puts("Cannot find MPS control daemon process");
        return 1;
    }
    if (write_all(fd, line, len) != 0) {
        return 1;
    }
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        if (write_all(STDOUT_FILENO, buf, (size_t)n) != 0) {
            return 1;
        }
    }
    return 0;
}
