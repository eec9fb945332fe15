// Package remote moves pinned memory between processes and machines: an
// [Agent] registers pinmem buffers, hands out remote keys for them, and
// puts to and gets from the regions of other agents, in this process, in
// another process on the host, or on another machine.
//
// The transport is UCX (libucp.so.0), loaded at run time through purego
// like the CUDA driver: no cgo and no C toolchain. Without the library,
// NewAgent returns an error matching [ErrUnavailable]. UCX chooses its
// transports (shared memory, TCP, InfiniBand/RoCE rc and dc, ...) from
// UCX_TLS and the hardware present, so the same code runs over shared
// memory and TCP on one machine and over RDMA between machines.
//
// # Registration, keys and blocks
//
// [Agent.Register] registers a pinmem buffer once, whatever range of it is
// asked for: later Registers of the same buffer reuse the registration (a
// range cache by buffer), so registering per tensor or per block costs a
// lookup, not a UCX registration. A registration larger than the agent's
// limit ([WithMaxRegistration], 2 GiB by default, since some RDMA NICs cap
// one memory region) is made in pieces; [Region.Registrations] lists them
// with the NUMA node of each. Freeing the buffer drops its registration
// first, and is refused with [ErrBusy] while a transfer uses it.
//
// [Agent.Alloc] has the transport allocate the memory instead, pinned by
// pinmem.Register: over shared memory UCX maps such memory into the other
// processes, so their puts and gets are single copies (as in UCX's own
// benchmarks), while a registered pinmem buffer is reached through UCX's
// emulation of remote access (messages the owner's thread copies). Expose
// memory from Alloc where shared-memory speed matters; over TCP and RDMA
// both are the same.
//
// [Region.Key] is a byte string to send to another agent (over any
// channel): the owner's worker address, the region's address and length,
// and the packed UCX remote keys, with a checksum. [Agent.Import] turns it
// into a [Remote] and connects, once per remote agent. [Remote.Put] and
// [Remote.Get] move a list of [Block]s with one completion (a flush: a Put
// has completed at the remote side when it returns), so a transfer of a
// thousand KV blocks is one call and one wait, not a thousand.
//
// # Threads, waits and faults
//
// Every UCX call of an agent is made by one goroutine locked to its OS
// thread, which also progresses the worker so that other agents' puts and
// gets to this one's memory are served; it sleeps on the worker's event
// descriptor when there is nothing to do. Every wait is bounded by the
// caller's context: when it ends during a transfer, the call returns its
// error and the connection is failed; the key must be imported again.
// UCX cannot take back bytes already sent (over TCP they land even after
// the connection was closed), so the transfer goes on in the background
// until it ended: meanwhile its local region stays busy (its buffer
// cannot be freed) and its blocks, local for a Get and remote for a Put,
// may still change; the connection is closed only after it, and a new
// connection to the same agent (Import) waits for it, so that no byte of
// a cut-short transfer lands after a transfer on the new connection.
//
// Faults are errors, never hangs: a malformed key matches [ErrBadKey] (a
// key is checked against its checksum and its framing, down to the framing
// of each packed UCX remote key; what UCX itself reads inside the worker
// address and the remote keys it cannot check, so a forged key with a
// right checksum may still abort the process inside UCX: take keys from
// peers you trust, over a channel you trust); a
// key whose agent is gone or whose region was closed [ErrStaleKey] (a key
// of another process's closed region cannot be detected by a one-sided
// put: its owner must not close a region a peer may still use); a block
// outside its region [ErrOutOfRange]; a peer that fails or is killed
// mid-transfer [ErrPeer] (or the context's error when the context ends
// before UCX notices).
//
// Puts and gets are one-sided: the owner of a region does not see them.
// Closing a region, freeing its buffer or closing its agent while a peer
// still uses its key is the owner's error, as with UCX and NIXL: over RDMA
// the peer's transfer then fails, but over transports where UCX emulates
// remote access (TCP, shared memory to registered pinmem memory) the
// owner's UCX copies into the address it is given, and memory freed
// meanwhile faults the owner. Tell peers to stop (drop their Remotes)
// before closing what they use.
//
// # Other backends
//
// The types are not UCX's: a region is local pinned memory, a key is
// opaque bytes, a transfer is a list of (local offset, remote offset,
// length) blocks. NIXL (its C API, libnixl_capi, is opaque handles and
// scalars, which purego binds as it binds UCX) would be a second backend
// behind the same types: an internal binding package, agent creation with
// a backend option, registration through nixl's register-memory call, the
// key carrying nixl's serialised agent metadata (the key's backend byte
// tells them apart), and Put/Get as one nixl transfer request of the block
// list, polled by the same thread. Mooncake's Transfer Engine (a C API of
// segment handles and batch transfers) fits the same way: a region is a
// registered local memory, a key carries the segment name and address, a
// block list is one batch.
package remote
