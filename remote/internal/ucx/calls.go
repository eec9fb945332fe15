package ucx

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"
)

// Layouts of UCP's parameter structures (UCX 1.13, LP64; offsets checked
// with offsetof against ucp.h). Fields pinmem never sets are padding.

type params struct { // ucp_params_t, 80 bytes
	fieldMask uint64 // 0
	features  uint64 // 8
	_         [56]byte
	name      *byte // 72
}

type workerParams struct { // ucp_worker_params_t, 200 bytes
	fieldMask  uint64 // 0
	threadMode int32  // 8
	_          [132]byte
	events     uint32 // 144
	_          [52]byte
}

type epParams struct { // ucp_ep_params_t, 104 bytes
	fieldMask uint64  // 0
	address   uintptr // 8
	errMode   int32   // 16
	_         [84]byte
}

type memMapParams struct { // ucp_mem_map_params_t, 40 bytes
	fieldMask uint64  // 0
	address   uintptr // 8
	length    uintptr // 16
	flags     uint32  // 24
	prot      uint32  // 28
	memType   int32   // 32
	_         int32
}

type memAttr struct { // ucp_mem_attr_t, 32 bytes
	fieldMask uint64  // 0
	address   uintptr // 8
	length    uintptr // 16
	memType   int32   // 24
	_         int32
}

type requestParam struct { // ucp_request_param_t, 72 bytes
	opAttrMask uint32 // 0
	flags      uint32 // 4
	_          [56]byte
	memh       uintptr // 64
}

// Field masks and flags (ucp.h, UCX 1.13).
const (
	paramFieldFeatures     = 1 << 0
	paramFieldName         = 1 << 8
	featureRMA             = 1 << 1
	featureWakeup          = 1 << 4
	workerFieldThreadMode  = 1 << 0
	workerFieldEvents      = 1 << 2
	wakeupRMA              = 1 << 0
	wakeupTX               = 1 << 10
	wakeupRX               = 1 << 11
	threadModeSingle       = 0
	epFieldRemoteAddress   = 1 << 0
	epFieldErrHandlingMode = 1 << 1
	errHandlingModePeer    = 1
	memMapFieldAddress     = 1 << 0
	memMapFieldLength      = 1 << 1
	memMapFieldFlags       = 1 << 2
	memMapAllocate         = 1 << 1
	memAttrAddress         = 1 << 0
	memAttrLength          = 1 << 1
	opAttrFieldFlags       = 1 << 4
	opAttrFieldMemh        = 1 << 8
	epCloseFlagForce       = 1 << 0
	_                      = unsafe.Sizeof(params{}) - 80 // compile-time size checks
	_                      = 80 - unsafe.Sizeof(params{})
	_                      = unsafe.Sizeof(workerParams{}) - 200
	_                      = 200 - unsafe.Sizeof(workerParams{})
	_                      = unsafe.Sizeof(epParams{}) - 104
	_                      = 104 - unsafe.Sizeof(epParams{})
	_                      = unsafe.Sizeof(memMapParams{}) - 40
	_                      = 40 - unsafe.Sizeof(memMapParams{})
	_                      = unsafe.Sizeof(memAttr{}) - 32
	_                      = 32 - unsafe.Sizeof(memAttr{})
	_                      = unsafe.Sizeof(requestParam{}) - 72
	_                      = 72 - unsafe.Sizeof(requestParam{})
)

// Init creates a UCP context for RMA (and wakeup events), with UCX's
// configuration read from the environment (UCX_TLS, UCX_NET_DEVICES ...)
// and then modified by set (UCX's names without the UCX_ prefix, e.g.
// "TLS": "tcp,self").
func (l *Lib) Init(name string, set map[string]string) (Context, error) {
	var cfg uintptr
	if s := status(callOut(l.s.configRead, 0, 0, uintptr(unsafe.Pointer(&cfg)))); s != OK {
		return 0, l.err("ucp_config_read", s)
	}
	defer call(l.s.configRelease, cfg)
	for k, v := range set {
		ck, cv := cstr(k), cstr(v)
		s := status(call(l.s.configModify, cfg, uintptr(unsafe.Pointer(ck)), uintptr(unsafe.Pointer(cv))))
		runtime.KeepAlive(ck)
		runtime.KeepAlive(cv)
		if s != OK {
			return 0, fmt.Errorf("UCX_%s=%q: %w: %w", k, v, ErrConfig, l.err("ucp_config_modify", s))
		}
	}
	p := &params{fieldMask: paramFieldFeatures | paramFieldName, features: featureRMA | featureWakeup, name: cstr(name)}
	var c Context
	s := status(callOut(l.s.initVersion, minMajor, minMinor, uintptr(unsafe.Pointer(p)), cfg, uintptr(unsafe.Pointer(&c))))
	runtime.KeepAlive(p)
	return c, l.err("ucp_init_version", s)
}

// Cleanup is ucp_cleanup.
func (l *Lib) Cleanup(c Context) { call(l.s.cleanup, uintptr(c)) }

// WorkerCreate creates a single-threaded worker that signals its event
// descriptor for RMA, send and receive completions.
func (l *Lib) WorkerCreate(c Context) (Worker, error) {
	p := &workerParams{fieldMask: workerFieldThreadMode | workerFieldEvents, threadMode: threadModeSingle, events: wakeupRMA | wakeupTX | wakeupRX}
	var w Worker
	s := status(callOut(l.s.workerCreate, uintptr(c), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&w))))
	runtime.KeepAlive(p)
	return w, l.err("ucp_worker_create", s)
}

// WorkerDestroy is ucp_worker_destroy.
func (l *Lib) WorkerDestroy(w Worker) { call(l.s.workerDestroy, uintptr(w)) }

// WorkerAddress returns a copy of the worker's address.
func (l *Lib) WorkerAddress(w Worker) ([]byte, error) {
	var p, n uintptr
	if s := status(callOut(l.s.workerGetAddress, uintptr(w), uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&n)))); s != OK {
		return nil, l.err("ucp_worker_get_address", s)
	}
	b := cbytes(p, n)
	call(l.s.workerReleaseAddress, uintptr(w), p)
	return b, nil
}

// Progress is ucp_worker_progress: the number of events it handled.
func (l *Lib) Progress(w Worker) uint32 { return uint32(call(l.s.workerProgress, uintptr(w))) }

// EventFD is ucp_worker_get_efd: a descriptor that becomes readable when
// the worker, once armed, has events.
func (l *Lib) EventFD(w Worker) (int, error) {
	var fd int32
	if s := status(callOut(l.s.workerGetEfd, uintptr(w), uintptr(unsafe.Pointer(&fd)))); s != OK {
		return -1, l.err("ucp_worker_get_efd", s)
	}
	return int(fd), nil
}

// Arm is ucp_worker_arm: OK when the worker may sleep on its descriptor,
// ErrBusy when it has events to progress first.
func (l *Lib) Arm(w Worker) Status { return status(call(l.s.workerArm, uintptr(w))) }

// EpCreate connects to the worker whose address is addr. With peerErrors,
// a peer that fails completes the endpoint's requests with an error (UCP's
// peer error handling); ucp_ep_create fails with ErrUnreachable when no
// transport to that worker can detect a failed peer (shared memory).
func (l *Lib) EpCreate(w Worker, addr []byte, peerErrors bool) (Ep, error) {
	if len(addr) == 0 {
		return 0, &Error{Op: "ucp_ep_create", Status: ErrInvalidAddr, Detail: "empty worker address"}
	}
	a := append([]byte(nil), addr...)
	p := &epParams{fieldMask: epFieldRemoteAddress, address: uintptr(unsafe.Pointer(&a[0]))}
	if peerErrors {
		p.fieldMask |= epFieldErrHandlingMode
		p.errMode = errHandlingModePeer
	}
	var ep Ep
	var s Status
	create := func() {
		s = status(callOut(l.s.epCreate, uintptr(w), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&ep))))
	}
	if peerErrors {
		l.quiet(create) // without a transport that detects failed peers UCX logs an error; the caller retries without
	} else {
		create()
	}
	runtime.KeepAlive(p)
	runtime.KeepAlive(a)
	return ep, l.err("ucp_ep_create", s)
}

// EpClose starts closing ep (force: at once, failing its outstanding
// requests with ErrCanceled). The returned request, if any, must be
// checked until done and freed.
func (l *Lib) EpClose(ep Ep, force bool) (Request, error) {
	p := &requestParam{}
	if force {
		p.opAttrMask, p.flags = opAttrFieldFlags, epCloseFlagForce
	}
	r := callOut(l.s.epCloseNbx, uintptr(ep), uintptr(unsafe.Pointer(p)))
	return l.request("ucp_ep_close_nbx", r)
}

// Flush starts a flush of ep: its request completes when every RMA
// operation issued on ep before it has completed at the remote side.
func (l *Lib) Flush(ep Ep) (Request, error) {
	p := &requestParam{}
	r := callOut(l.s.epFlushNbx, uintptr(ep), uintptr(unsafe.Pointer(p)))
	return l.request("ucp_ep_flush_nbx", r)
}

// MemMap registers [addr, addr+n) with the context.
func (l *Lib) MemMap(c Context, addr, n uintptr) (Memh, error) {
	p := &memMapParams{fieldMask: memMapFieldAddress | memMapFieldLength, address: addr, length: n}
	var m Memh
	s := status(callOut(l.s.memMap, uintptr(c), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&m))))
	runtime.KeepAlive(p)
	return m, l.err("ucp_mem_map", s)
}

// MemAlloc has UCX allocate n bytes and register them (UCP_MEM_MAP_ALLOCATE):
// with a shared-memory transport the memory is a segment that other
// processes on the host map, so that their puts and gets are copies into
// and out of it. It returns the registration and the memory's address and
// length (at least n); MemUnmap frees it.
func (l *Lib) MemAlloc(c Context, n uintptr) (Memh, uintptr, uintptr, error) {
	p := &memMapParams{fieldMask: memMapFieldAddress | memMapFieldLength | memMapFieldFlags, length: n, flags: memMapAllocate}
	var m Memh
	s := status(callOut(l.s.memMap, uintptr(c), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&m))))
	runtime.KeepAlive(p)
	if s != OK {
		return 0, 0, 0, l.err("ucp_mem_map(ALLOCATE)", s)
	}
	a := &memAttr{fieldMask: memAttrAddress | memAttrLength}
	s = status(callOut(l.s.memQuery, uintptr(m), uintptr(unsafe.Pointer(a))))
	runtime.KeepAlive(a)
	if s != OK {
		_ = l.MemUnmap(c, m)
		return 0, 0, 0, l.err("ucp_mem_query", s)
	}
	return m, a.address, a.length, nil
}

// Bytes is the memory at addr, n bytes long (memory UCX allocated).
func Bytes(addr, n uintptr) []byte { return unsafe.Slice((*byte)(cptr(addr)), n) }

// MemUnmap is ucp_mem_unmap.
func (l *Lib) MemUnmap(c Context, m Memh) error {
	return l.err("ucp_mem_unmap", status(call(l.s.memUnmap, uintptr(c), uintptr(m))))
}

// RkeyPack returns a copy of m's packed remote key.
func (l *Lib) RkeyPack(c Context, m Memh) ([]byte, error) {
	var p, n uintptr
	if s := status(callOut(l.s.rkeyPack, uintptr(c), uintptr(m), uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&n)))); s != OK {
		return nil, l.err("ucp_rkey_pack", s)
	}
	b := cbytes(p, n)
	call(l.s.rkeyBufferRelease, p)
	return b, nil
}

// RkeyUnpack unpacks a packed remote key for use on ep.
func (l *Lib) RkeyUnpack(ep Ep, packed []byte) (Rkey, error) {
	if len(packed) == 0 {
		return 0, &Error{Op: "ucp_ep_rkey_unpack", Status: ErrInvalidParam, Detail: "empty remote key"}
	}
	b := append([]byte(nil), packed...)
	var r Rkey
	s := status(callOut(l.s.epRkeyUnpack, uintptr(ep), uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&r))))
	runtime.KeepAlive(b)
	return r, l.err("ucp_ep_rkey_unpack", s)
}

// CheckRkey checks the framing of a packed remote key, which
// ucp_ep_rkey_unpack reads without being told its length: a 64-bit map of
// the owner's memory domains, a memory type byte, then for each domain in
// the map a size byte and that many bytes (UCX 1.x; later releases may
// append more, which is allowed). It returns an error when the key is
// shorter than its framing says, so that UCX never reads past it. It
// cannot check what UCX's transports read inside each domain's part.
func CheckRkey(packed []byte) error {
	const head = 8 + 1 // md_map, mem_type
	if len(packed) < head {
		return fmt.Errorf("packed remote key of %d bytes: shorter than its %d-byte header", len(packed), head)
	}
	mds := binary.LittleEndian.Uint64(packed)
	at := head
	for i := range 64 {
		if mds&(1<<i) == 0 {
			continue
		}
		if at >= len(packed) {
			return fmt.Errorf("packed remote key of %d bytes ends before memory domain %d's size", len(packed), i)
		}
		at += 1 + int(packed[at])
		if at > len(packed) {
			return fmt.Errorf("packed remote key of %d bytes ends inside memory domain %d's part (to byte %d)", len(packed), i, at)
		}
	}
	return nil
}

// RkeyDestroy is ucp_rkey_destroy.
func (l *Lib) RkeyDestroy(r Rkey) { call(l.s.rkeyDestroy, uintptr(r)) }

// Put starts writing n bytes at local (registered as memh, 0 if unknown)
// to remote through rkey. A returned request must be freed.
func (l *Lib) Put(ep Ep, local, n uintptr, remote uint64, rkey Rkey, memh Memh) (Request, error) {
	p := &requestParam{}
	if memh != 0 {
		p.opAttrMask, p.memh = opAttrFieldMemh, uintptr(memh)
	}
	r := callOut(l.s.putNbx, uintptr(ep), local, n, uintptr(remote), uintptr(rkey), uintptr(unsafe.Pointer(p)))
	return l.request("ucp_put_nbx", r)
}

// Get starts reading n bytes at remote through rkey into local.
func (l *Lib) Get(ep Ep, local, n uintptr, remote uint64, rkey Rkey, memh Memh) (Request, error) {
	p := &requestParam{}
	if memh != 0 {
		p.opAttrMask, p.memh = opAttrFieldMemh, uintptr(memh)
	}
	r := callOut(l.s.getNbx, uintptr(ep), local, n, uintptr(remote), uintptr(rkey), uintptr(unsafe.Pointer(p)))
	return l.request("ucp_get_nbx", r)
}

// request classifies an _nbx call's result: done (0, nil), failed (0,
// error) or in progress (the request).
func (l *Lib) request(op string, r uintptr) (Request, error) {
	switch {
	case r == 0:
		return 0, nil
	case r >= statusMaxPointerValue:
		return 0, l.err(op, status(r))
	}
	return Request(r), nil
}

// Check is ucp_request_check_status: InProgress, OK or the error.
func (l *Lib) Check(r Request) Status { return status(call(l.s.requestCheckStatus, uintptr(r))) }

// Free is ucp_request_free: a request still in progress completes on its
// own, unobserved.
func (l *Lib) Free(r Request) { call(l.s.requestFree, uintptr(r)) }

// Err is the error of a request's final status (nil for OK).
func (l *Lib) Err(op string, s Status) error { return l.err(op, s) }
