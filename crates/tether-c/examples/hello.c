#include <stdio.h>   /* Hello, tether: a server that takes in any client, and a client. */
#include <tether.h>
#define CHECK(call) if ((call) != TETHER_OK) { fprintf(stderr, "%s\n", tether_last_error()); return 1; }

int main(void) {
    tether_endpoint *server, *client;
    tether_builder *b = tether_builder_new(1);          /* node 1, the server */
    CHECK(tether_builder_bind(b, "127.0.0.1:0"));       /* any free port */
    CHECK(tether_builder_accept(b, 16, 1));             /* take in clients not given (no key) */
    CHECK(tether_build(b, &server));
    char addr[64];
    CHECK(tether_local_addr(server, addr, sizeof addr));
    b = tether_builder_new(2);                          /* node 2, the client */
    CHECK(tether_builder_bind(b, "127.0.0.1:0"));
    CHECK(tether_builder_peer(b, 1, addr));
    CHECK(tether_build(b, &client));
    CHECK(tether_send(client, 1, (const uint8_t *)"hello", 5, NULL));
    tether_message *m;
    CHECK(tether_recv(server, 5000, &m));
    size_t len;
    const uint8_t *data = tether_message_data(m, &len);
    printf("node %u says %.*s\n", tether_message_from(m), (int)len, (const char *)data);
    tether_message_free(m);
    return tether_close(client, 1000) != TETHER_OK || tether_close(server, 1000) != TETHER_OK;
}
