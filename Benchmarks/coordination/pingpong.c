/* Reference for the cross-process benchmark: the floor a claim round trip cannot beat on this
 * machine at this moment. Two processes ping-pong a small message over a Unix socketpair, the
 * client blocking in poll+read as the coordination client does; prints "median_ns N".
 * Usage: pingpong COUNT */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 20000;
    if (count <= 0) return 64;
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 1;
    char message[64] = {0};
    pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
        close(fds[0]);
        for (;;) {
            struct pollfd p = {fds[1], POLLIN, 0};
            if (poll(&p, 1, -1) < 0) _exit(1);
            if (read(fds[1], message, sizeof message) <= 0) _exit(0);
            if (write(fds[1], message, 40) != 40) _exit(1);
        }
    }
    close(fds[1]);
    uint64_t *samples = malloc(sizeof(uint64_t) * (size_t)count);
    if (!samples) return 1;
    for (int i = 0; i < count; i++) {
        uint64_t before = now_ns();
        if (write(fds[0], message, 60) != 60) return 1;
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, -1) < 0) return 1;
        if (read(fds[0], message, sizeof message) <= 0) return 1;
        samples[i] = now_ns() - before;
    }
    close(fds[0]);
    waitpid(child, NULL, 0);
    qsort(samples, (size_t)count, sizeof(uint64_t), compare);
    printf("median_ns %llu\n", (unsigned long long)samples[count / 2]);
    return 0;
}
