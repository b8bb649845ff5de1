/* A program attached to the node's engine process (`tether engine`,
 * docs/ENGINE.md): its protocol runs in the engine, which can die or hang
 * and be replaced with nothing lost. It exchanges messages with an
 * endpoint embedded in this process.
 *
 *   tether engine --dir /dev/shm/my-engine --bind 127.0.0.1:7400 &
 *   ./engine /dev/shm/my-engine 127.0.0.1:7400
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tether.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        tether_status s_ = (call);                                                       \
        if (s_ != TETHER_OK) {                                                           \
            fprintf(stderr, "%s: %s (status %d)\n", #call, tether_last_error(), (int)s_); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ENGINE_DIR ENGINE_ADDR\n", argv[0]);
        return 2;
    }
    tether_endpoint *embedded, *attached;
    tether_builder *b = tether_builder_new(1);
    CHECK(tether_builder_bind(b, "127.0.0.1:0"));
    CHECK(tether_builder_peer(b, 2, argv[2]));
    CHECK(tether_build(b, &embedded));
    char addr[64];
    CHECK(tether_local_addr(embedded, addr, sizeof addr));
    b = tether_builder_new(2);
    CHECK(tether_builder_engine(b, argv[1]));
    CHECK(tether_builder_peer(b, 1, addr));
    CHECK(tether_build(b, &attached));
    for (uint32_t i = 0; i < 100; i++) {
        tether_message *m, *back;
        CHECK(tether_send_blocking(attached, 1, (const uint8_t *)&i, sizeof i, 5000, NULL));
        CHECK(tether_recv(embedded, 5000, &m));
        size_t len;
        const uint8_t *data = tether_message_data(m, &len);
        CHECK(tether_send_blocking(embedded, 2, data, len, 5000, NULL));
        tether_message_free(m);
        CHECK(tether_recv(attached, 5000, &back));
        data = tether_message_data(back, &len);
        if (len != sizeof i || memcmp(data, &i, sizeof i) != 0) {
            fprintf(stderr, "round trip %u: wrong bytes back\n", i);
            return 1;
        }
        tether_message_free(back);
    }
    printf("100 round trips through the engine, each exact\n");
    CHECK(tether_close(attached, 1000));
    CHECK(tether_close(embedded, 1000));
    return 0;
}
