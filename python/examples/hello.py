"""Hello, tether: a server that takes in any client, and a client."""
import tether

server = tether.Endpoint(1, bind="127.0.0.1:0", accept=16, accept_unkeyed=True)
client = tether.Endpoint(2, bind="127.0.0.1:0", peers={1: server.local_addr})

sent = client.send(1, b"hello")
msg = server.recv(timeout=5)
print(f"node {msg.sender} says {bytes(msg).decode()}")
print("the message was", sent.wait(timeout=5))

server.send(msg.sender, b"hello back")  # node 2 is the server's peer now
print(f"node 1 answers {bytes(client.recv(timeout=5)).decode()}")

client.close()
server.close()
