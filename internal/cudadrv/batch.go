package cudadrv

import (
	"fmt"
	"runtime"
	"unsafe"
)

// BatchKind names the driver call of a BatchOp.
type BatchKind uint8

// Batchable calls: asynchronous, stream-ordered, quick to issue.
const (
	BatchCopyHtoD    BatchKind = iota + 1 // cuMemcpyHtoDAsync_v2(Dev, Host, N, Stream)
	BatchCopyDtoH                         // cuMemcpyDtoHAsync_v2(Host, Dev, N, Stream)
	BatchCopyDtoD                         // cuMemcpyDtoDAsync_v2(Dev, Dev2, N, Stream)
	BatchEventRecord                      // cuEventRecord(Event, Stream)
)

// String returns the driver function's name.
func (k BatchKind) String() string {
	switch k {
	case BatchCopyHtoD:
		return "cuMemcpyHtoDAsync_v2"
	case BatchCopyDtoH:
		return "cuMemcpyDtoHAsync_v2"
	case BatchCopyDtoD:
		return "cuMemcpyDtoDAsync_v2"
	case BatchEventRecord:
		return "cuEventRecord"
	}
	return fmt.Sprintf("BatchKind(%d)", uint8(k))
}

// BatchOp is one call of a batch. Host must point to memory that stays
// alive and in place (pinned memory, or memory kept reachable by the
// caller) until the call has been issued.
type BatchOp struct {
	Kind   BatchKind
	Dev    DevicePtr // the device side of a copy (destination of DtoD)
	Dev2   DevicePtr // DtoD: the source
	Host   unsafe.Pointer
	N      uint64
	Stream Stream
	Event  Event
}

// Batcher is a driver that issues a whole batch with one crossing into C.
type Batcher interface {
	// Batch issues ops in order and stops at the first failure. It returns
	// how many were issued (the failing one excluded) and that failure.
	Batch(ops []BatchOp) (int, error)
}

// RunBatch issues ops in order through d, with one crossing into the
// driver where d is a Batcher (the real binding) and one call per op
// otherwise (the fake driver). It stops at the first failure and returns
// how many ops were issued before it.
func RunBatch(d Driver, ops []BatchOp) (int, error) {
	if b, ok := d.(Batcher); ok {
		return b.Batch(ops)
	}
	for i, op := range ops {
		var err error
		switch op.Kind {
		case BatchCopyHtoD:
			err = d.MemcpyHtoDAsync(op.Dev, op.Host, op.N, op.Stream)
		case BatchCopyDtoH:
			err = d.MemcpyDtoHAsync(op.Host, op.Dev, op.N, op.Stream)
		case BatchCopyDtoD:
			err = d.MemcpyDtoDAsync(op.Dev, op.Dev2, op.N, op.Stream)
		case BatchEventRecord:
			err = d.EventRecord(op.Event, op.Stream)
		default:
			err = fmt.Errorf("cudadrv: batch op %d: %v: %w", i, op.Kind, ErrInvalidValue)
		}
		if err != nil {
			return i, err
		}
	}
	return len(ops), nil
}

// batchChunk is how many calls one crossing carries (frames live on the
// goroutine's stack: 16 x 112 bytes).
const batchChunk = 16

// Batch issues ops with one runtime.cgocall per batchChunk ops.
func (l *lib) Batch(ops []BatchOp) (int, error) {
	done := 0
	for done < len(ops) {
		n, err := l.issueChunk(ops[done:min(len(ops), done+batchChunk)])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// issueChunk issues at most batchChunk ops with one crossing.
func (l *lib) issueChunk(ops []BatchOp) (int, error) {
	var frames [batchChunk]cframe
	for i, op := range ops {
		f := &frames[i]
		var addr *uintptr
		switch op.Kind {
		case BatchCopyHtoD:
			addr = &l.s.memcpyHtoDAsync
			f.args[0], f.args[1], f.args[2], f.args[3] = uintptr(op.Dev), uintptr(op.Host), uintptr(op.N), uintptr(op.Stream)
		case BatchCopyDtoH:
			addr = &l.s.memcpyDtoHAsync
			f.args[0], f.args[1], f.args[2], f.args[3] = uintptr(op.Host), uintptr(op.Dev), uintptr(op.N), uintptr(op.Stream)
		case BatchCopyDtoD:
			addr = &l.s.memcpyDtoDAsync
			f.args[0], f.args[1], f.args[2], f.args[3] = uintptr(op.Dev), uintptr(op.Dev2), uintptr(op.N), uintptr(op.Stream)
		case BatchEventRecord:
			addr = &l.s.eventRecord
			f.args[0], f.args[1] = uintptr(op.Event), uintptr(op.Stream)
		default:
			return l.batchSlow(ops[:i], fmt.Errorf("cudadrv: batch op %d: %v: %w", i, op.Kind, ErrInvalidValue))
		}
		if *addr == 0 {
			return l.batchSlow(ops[:i], &LoadError{Path: l.path, Symbol: l.missing[uintptr(unsafe.Pointer(addr))], Err: ErrNotSupported})
		}
		f.fn = *addr
	}
	done, r := ccallSeq(frames[:len(ops)])
	for _, op := range ops { // the host memory must outlive the crossing
		runtime.KeepAlive(op.Host)
	}
	if done < len(ops) {
		return done, l.errorOf(ops[done].Kind.String(), r)
	}
	return done, nil
}

// batchSlow issues the valid ops before a bad one, then reports the bad one.
func (l *lib) batchSlow(ops []BatchOp, bad error) (int, error) {
	if len(ops) > 0 {
		if n, err := l.Batch(ops); err != nil {
			return n, err
		}
	}
	return len(ops), bad
}

// ccallSeqSlow is ccallSeq one crossing per call.
func ccallSeqSlow(frames []cframe) (int, Result) {
	for i := range frames {
		f := &frames[i]
		f.r1 = ccall(f.fn, f.args[:]...)
		if r := Result(int32(f.r1)); r != Success {
			return i, r
		}
	}
	return len(frames), Success
}
