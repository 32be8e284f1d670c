#pragma once
// TCP checks the RPC devices, the benchmarks and the tests share.
#include <string>

namespace specula {

// Whether something accepts TCP connections at host:port now.
bool accepts_connections(const std::string & host, const std::string & port);
// A port free on 127.0.0.1 now (the kernel's choice), for a server that cannot report its own.
// Throws Error when no socket can be bound.
int free_loopback_port();

}  // namespace specula
