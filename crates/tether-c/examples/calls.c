/* A request/reply server and its client, as two processes:
 *
 *   calls server 127.0.0.1:7300            answers calls to handler 7 (reverse the bytes)
 *   calls client 127.0.0.1:7300 N          makes N calls and checks every reply
 *
 * The server takes in any client (no key: tether_builder_accept's opt-in)
 * and serves until it has answered N calls (its third argument, 0: for ever).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tether.h>

#define CHECK(call)                                                     \
    do {                                                                \
        tether_status s_ = (call);                                      \
        if (s_ != TETHER_OK) {                                          \
            fprintf(stderr, "%s: %s (status %d)\n", #call,              \
                    tether_last_error(), (int)s_);                      \
            exit(1);                                                    \
        }                                                               \
    } while (0)

/* The handler: the reply is the arguments reversed. */
static void reverse(void *ctx, uint32_t from, const uint8_t *args, size_t len, tether_bytes *reply) {
    (void)ctx;
    (void)from;
    uint8_t buf[256];
    if (len > sizeof buf) len = sizeof buf;
    for (size_t i = 0; i < len; i++) buf[i] = args[len - 1 - i];
    tether_reply_set(reply, buf, len);
}

static int server(const char *addr, long calls) {
    tether_builder *b = tether_builder_new(1);
    CHECK(tether_builder_bind(b, addr));
    CHECK(tether_builder_accept(b, 64, 1));
    tether_endpoint *ep;
    CHECK(tether_build(b, &ep));
    CHECK(tether_register_handler(ep, 7, reverse, NULL));
    printf("serving on %s\n", addr);
    fflush(stdout);
    for (long served = 0; calls == 0 || served < calls;) {
        tether_status s = tether_serve(ep, 1000);
        if (s == TETHER_OK) served++;
        else if (s != TETHER_ERR_TIMED_OUT) CHECK(s);
    }
    /* Linger so the last replies are acknowledged before the endpoint goes. */
    CHECK(tether_close(ep, 2000));
    return 0;
}

static int client(const char *addr, long calls) {
    tether_builder *b = tether_builder_new(2);
    CHECK(tether_builder_bind(b, "127.0.0.1:0"));
    CHECK(tether_builder_peer(b, 1, addr));
    tether_endpoint *ep;
    CHECK(tether_build(b, &ep));
    for (long i = 0; i < calls; i++) {
        char args[32];
        int n = snprintf(args, sizeof args, "call %ld", i);
        tether_call_result r;
        CHECK(tether_request(ep, 1, 7, (const uint8_t *)args, (size_t)n, 5000, &r));
        size_t len = 0;
        const uint8_t *reply = tether_bytes_data(r.reply, &len);
        int ok = r.processed && r.executed == 1 && len == (size_t)n;
        for (int j = 0; ok && j < n; j++) ok = reply[j] == (uint8_t)args[n - 1 - j];
        tether_bytes_free(r.reply);
        if (!ok) {
            fprintf(stderr, "call %ld: wrong reply or state (processed %d, executed %d)\n", i, r.processed, r.executed);
            return 1;
        }
    }
    printf("%ld calls answered, every reply right\n", calls);
    CHECK(tether_close(ep, 1000));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: %s server ADDR [CALLS] | client ADDR CALLS\n", argv[0]);
        return 2;
    }
    long calls = argc > 3 ? atol(argv[3]) : 0;
    return strcmp(argv[1], "server") == 0 ? server(argv[2], calls) : client(argv[2], calls);
}
