/* Tests that stand for several processes with tcp fabrics in one process:
 * a listening socket on 127.0.0.1 at a port the kernel picks, handed to a
 * fabric with the tcp option listen_fds= (no race for the port). */
#ifndef DSIM_TESTS_LOOPBACK_H
#define DSIM_TESTS_LOOPBACK_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* The socket, its port in *port; -1 when it cannot be made. */
static inline int test_listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

#endif
