/* Surviving a killed peer: what the application sees.
 *
 * A receiver runs as a child process; this process streams messages to
 * it, kills it with SIGKILL mid-stream, and reads the event that says
 * exactly which messages failed, and which of those may still have
 * arrived (their acknowledgement lost with the peer). A new receiver
 * takes the old one's place at the same address and greets this process
 * (it is given this one's address): the restart is an event, and the
 * stream goes on with the new life.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <tether.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        tether_status s_ = (call);                                                       \
        if (s_ != TETHER_OK) {                                                           \
            fprintf(stderr, "%s: %s (status %d)\n", #call, tether_last_error(), (int)s_); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static int receiver(const char *addr, const char *sender) {
    tether_builder *b = tether_builder_new(2);
    CHECK(tether_builder_bind(b, addr));
    CHECK(tether_builder_peer(b, 1, sender));
    tether_endpoint *ep;
    CHECK(tether_build(b, &ep));
    for (;;) { /* until killed */
        tether_message *m;
        if (tether_recv(ep, -1, &m) == TETHER_OK) tether_message_free(m);
    }
}

static pid_t start(const char *addr, const char *sender) {
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "killed_peer", "receiver", addr, sender, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static const char *name(tether_state s) {
    switch (s) {
    case TETHER_PENDING: return "pending";
    case TETHER_DELIVERED: return "delivered";
    case TETHER_FAILED_UNREACHABLE: return "failed: peer unreachable";
    case TETHER_FAILED_RESTARTED: return "failed: peer restarted";
    default: return "failed";
    }
}

/* A free port on loopback, as "127.0.0.1:PORT". */
static int free_addr(char *buf, size_t cap) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (s < 0 || bind(s, (struct sockaddr *)&sa, len) || getsockname(s, (struct sockaddr *)&sa, &len)) return -1;
    close(s);
    snprintf(buf, cap, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    return 0;
}

/* The next event of `kind`. */
static tether_event next(tether_endpoint *ep, tether_event_kind kind) {
    tether_event e;
    do CHECK(tether_next_event(ep, 30000, &e)); while (e.kind != kind);
    return e;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "receiver") == 0) return receiver(argv[2], argv[3]);
    char addr[32], me[32];
    if (free_addr(addr, sizeof addr) || free_addr(me, sizeof me)) return 1;
    pid_t child = start(addr, me);
    /* A silent peer is given up after a second (the default is 5 s): any
     * option can come from the environment (docs/OPERATING.md). */
    setenv("TETHER_CONFIG_ABANDON_AFTER", "1s", 1);
    tether_builder *b = tether_builder_new(1);
    CHECK(tether_builder_bind(b, me));
    CHECK(tether_builder_peer(b, 2, addr));
    tether_endpoint *ep;
    CHECK(tether_build(b, &ep));
    uint64_t seq;
    CHECK(tether_send(ep, 2, (const uint8_t *)"are you there?", 14, &seq));
    CHECK(tether_flush(ep, 30000));
    printf("first message: %s\n", name(tether_message_state(ep, 2, seq)));
    uint8_t block[1000] = {0};
    uint64_t first_seq = seq + 1;
    for (int i = 0; i < 200; i++) CHECK(tether_send_blocking(ep, 2, block, sizeof block, 30000, &seq));
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    tether_event e = next(ep, TETHER_EVENT_PEER_UNREACHABLE);
    int acked = 0;
    for (uint64_t q = first_seq; q <= seq; q++) acked += tether_message_state(ep, 2, q) == TETHER_DELIVERED;
    printf("peer %u unreachable: messages %llu to %llu failed (%llu of them perhaps delivered, ack lost); %d were acknowledged\n",
           e.peer, (unsigned long long)e.first, (unsigned long long)(e.end - 1),
           (unsigned long long)(e.in_doubt_end - e.first), acked);
    child = start(addr, me); /* a new life at the same address */
    e = next(ep, TETHER_EVENT_PEER_RESTARTED);
    printf("peer %u restarted: its new life greeted us\n", e.peer);
    CHECK(tether_send(ep, 2, (const uint8_t *)"hello again", 11, &seq));
    CHECK(tether_flush(ep, 30000));
    printf("sent to the new life: %s\n", name(tether_message_state(ep, 2, seq)));
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK(tether_close(ep, 1000));
    return 0;
}
