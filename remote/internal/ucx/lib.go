// Package ucx binds the parts of UCX's UCP API (libucp.so.0) that pinmem's
// remote transport uses, through purego: no cgo, no C headers. It owns the
// structure layouts and the calls; package remote owns the policy (which
// thread calls, ranges, errors users see).
//
// The layouts are those of UCX 1.13 (include/ucp/api/ucp.h, ucp_def.h) on
// 64-bit Linux, checked against the headers with offsetof. UCX keeps them
// ABI-stable: every parameter structure starts with a field mask, newer
// releases only append fields, and a field is read only when its bit is
// set, so a library of release 1.13 or later reads them as written here.
//
// Every call on a Context, Worker, Ep or Rkey must come from one thread at
// a time (the worker is created UCS_THREAD_MODE_SINGLE): package remote
// makes them all from one goroutine locked to its OS thread.
package ucx

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EnvLibrary names an environment variable that gives the path of the UCP
// library to load instead of libucp.so.0.
const EnvLibrary = "PINMEM_LIBUCP"

// defaultLibrary is UCP's soname, found through the dynamic loader's path.
const defaultLibrary = "libucp.so.0"

// minVersion is the oldest UCP release whose layouts this binding writes.
const minMajor, minMinor = 1, 13

// Handles of UCX objects: opaque pointers owned by the library.
type (
	Context uintptr // ucp_context_h
	Worker  uintptr // ucp_worker_h
	Ep      uintptr // ucp_ep_h
	Memh    uintptr // ucp_mem_h
	Rkey    uintptr // ucp_rkey_h
	Request uintptr // a request returned by an _nbx call; 0: none (done)
)

type symbols struct {
	getVersion, configRead, configModify, configRelease, initVersion, cleanup uintptr
	workerCreate, workerDestroy, workerGetAddress, workerReleaseAddress       uintptr
	workerProgress, workerGetEfd, workerArm                                   uintptr
	epCreate, epCloseNbx, epFlushNbx, memMap, memUnmap, memQuery              uintptr
	rkeyPack, rkeyBufferRelease, epRkeyUnpack, rkeyDestroy                    uintptr
	putNbx, getNbx, requestCheckStatus, requestFree, statusString             uintptr

	// Optional (libucs): the global log level, lowered around a call whose
	// failure is expected and handled (quiet).
	globalGet, globalSet uintptr
}

func (s *symbols) table() []struct {
	name string
	addr *uintptr
} {
	return []struct {
		name string
		addr *uintptr
	}{
		{"ucp_get_version", &s.getVersion},
		{"ucp_config_read", &s.configRead},
		{"ucp_config_modify", &s.configModify},
		{"ucp_config_release", &s.configRelease},
		{"ucp_init_version", &s.initVersion},
		{"ucp_cleanup", &s.cleanup},
		{"ucp_worker_create", &s.workerCreate},
		{"ucp_worker_destroy", &s.workerDestroy},
		{"ucp_worker_get_address", &s.workerGetAddress},
		{"ucp_worker_release_address", &s.workerReleaseAddress},
		{"ucp_worker_progress", &s.workerProgress},
		{"ucp_worker_get_efd", &s.workerGetEfd},
		{"ucp_worker_arm", &s.workerArm},
		{"ucp_ep_create", &s.epCreate},
		{"ucp_ep_close_nbx", &s.epCloseNbx},
		{"ucp_ep_flush_nbx", &s.epFlushNbx},
		{"ucp_mem_map", &s.memMap},
		{"ucp_mem_unmap", &s.memUnmap},
		{"ucp_mem_query", &s.memQuery},
		{"ucp_rkey_pack", &s.rkeyPack},
		{"ucp_rkey_buffer_release", &s.rkeyBufferRelease},
		{"ucp_ep_rkey_unpack", &s.epRkeyUnpack},
		{"ucp_rkey_destroy", &s.rkeyDestroy},
		{"ucp_put_nbx", &s.putNbx},
		{"ucp_get_nbx", &s.getNbx},
		{"ucp_request_check_status", &s.requestCheckStatus},
		{"ucp_request_free", &s.requestFree},
		{"ucs_status_string", &s.statusString}, // libucs, a dependency: found through libucp's handle
	}
}

// Lib is the loaded library.
type Lib struct {
	Path                  string
	Major, Minor, Release uint32
	s                     symbols
}

var (
	openOnce sync.Once
	openLib  *Lib
	openErr  error
)

// LibraryPath is the library Open loads: $PINMEM_LIBUCP or libucp.so.0.
func LibraryPath() string {
	if p := os.Getenv(EnvLibrary); p != "" {
		return p
	}
	return defaultLibrary
}

// Open loads libucp once per process and returns it, or an error matching
// ErrUnavailable (remembered: later calls return it again).
//
// Before the library loads, UCX_ERROR_SIGNALS is set to the empty string
// unless the environment sets it: by default UCX's libucs installs its own
// SIGSEGV and SIGBUS handlers when it loads, which would take over the Go
// runtime's (a nil-pointer panic would become UCX's backtrace and abort).
func Open() (*Lib, error) {
	openOnce.Do(func() { openLib, openErr = load(LibraryPath()) })
	return openLib, openErr
}

func load(path string) (*Lib, error) {
	if _, set := os.LookupEnv("UCX_ERROR_SIGNALS"); !set {
		os.Setenv("UCX_ERROR_SIGNALS", "")
	}
	h, err := dlopen(path)
	if err != nil {
		return nil, &LoadError{Path: path, Err: err}
	}
	l := &Lib{Path: path}
	for _, e := range l.s.table() {
		a, err := dlsym(h, e.name)
		if err != nil || a == 0 {
			return nil, &LoadError{Path: path, Err: fmt.Errorf("symbol %s missing (UCX older than %d.%d?)", e.name, minMajor, minMinor)}
		}
		*e.addr = a
	}
	l.s.globalGet, _ = dlsym(h, "ucs_global_opts_get_value")
	l.s.globalSet, _ = dlsym(h, "ucs_global_opts_set_value")
	var major, minor, release uint32
	callOut(l.s.getVersion, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor)), uintptr(unsafe.Pointer(&release)))
	l.Major, l.Minor, l.Release = major, minor, release
	if major != minMajor || minor < minMinor {
		return nil, &LoadError{Path: path, Err: fmt.Errorf("UCX %d.%d.%d: this binding needs %d.%d or later of major version %d", major, minor, release, minMajor, minMinor, minMajor)}
	}
	return l, nil
}

// quietMu serialises quiet's save, set and restore of the global level.
var quietMu sync.Mutex

// quiet runs f with UCX's log level at "fatal": f is a call whose failure
// the caller expects and handles, and which UCX would report as an error
// on stderr.
func (l *Lib) quiet(f func()) {
	if l.s.globalGet == 0 || l.s.globalSet == 0 {
		f()
		return
	}
	quietMu.Lock()
	defer quietMu.Unlock()
	name, fatal := cstr("LOG_LEVEL"), cstr("fatal")
	prev := make([]byte, 64)
	if status(call(l.s.globalGet, uintptr(unsafe.Pointer(name)), uintptr(unsafe.Pointer(&prev[0])), uintptr(len(prev)))) != OK {
		f()
		return
	}
	call(l.s.globalSet, uintptr(unsafe.Pointer(name)), uintptr(unsafe.Pointer(fatal)))
	f()
	call(l.s.globalSet, uintptr(unsafe.Pointer(name)), uintptr(unsafe.Pointer(&prev[0])))
	runtime.KeepAlive(name)
	runtime.KeepAlive(fatal)
	runtime.KeepAlive(prev)
}

// call calls fn with args through purego. Arguments that point into Go
// memory must be kept alive by the caller.
func call(fn uintptr, args ...uintptr) uintptr {
	r1, _, _ := purego.SyscallN(fn, args...)
	return r1
}

// callOut is call for arguments that are addresses of Go variables (out
// parameters, parameter structures): //go:uintptrescapes moves each to the
// heap, where it cannot move while C writes to it.
//
//go:uintptrescapes
//go:noinline
func callOut(fn uintptr, args ...uintptr) uintptr { return call(fn, args...) }

// cstr is s as a NUL-terminated C string.
func cstr(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

func (l *Lib) err(op string, s Status) error {
	if s == OK {
		return nil
	}
	return &Error{Op: op, Status: s, Detail: l.StatusString(s)}
}

// StatusString is ucs_status_string(s).
func (l *Lib) StatusString(s Status) string {
	p := call(l.s.statusString, uintptr(int64(s)))
	if p == 0 {
		return ""
	}
	c := cptr(p)
	n := 0
	for n < 256 && *(*byte)(unsafe.Add(c, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(c), n))
}

// cptr turns an address C returned into a pointer (C memory: the Go
// garbage collector ignores it) without vet's uintptr-to-pointer warning.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// cbytes copies n bytes of C memory at p.
func cbytes(p, n uintptr) []byte {
	return append([]byte(nil), unsafe.Slice((*byte)(cptr(p)), n)...)
}

// status reads a ucs_status_t returned in a register: a packed enum
// (UCS_S_PACKED), one signed byte; the bits above it are not defined.
func status(r uintptr) Status { return Status(int8(r)) }
