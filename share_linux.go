//go:build linux

package pinmem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/cuda"
)

func closeFD(fd int) { _ = unix.Close(fd) }

// AllocShared allocates size bytes of pinned memory that SendShared can
// hand to another process: a memfd of the rounded-up size, sealed against
// shrinking and growing (so that no process can cut the pages from under
// another's mapping; ReceiveShared refuses a file without the seal),
// mapped shared and registered with cuMemHostRegister (flags: Portable,
// Mapped, ReadOnly). It is counted, budgeted and freed like Alloc's buffers (of
// KindMmapRegister); its pages are released when no process maps them.
// Options as for Alloc (the device; NUMA placement and huge pages do not
// apply).
func AllocShared(size int, flags Flags, opts ...Option) (*Buffer, error) {
	o, err := buildOptions("pinmem.AllocShared", opts)
	if err == nil {
		err = checkSize("AllocShared", size)
	}
	if err == nil && flags&^(Portable|Mapped|ReadOnly) != 0 {
		err = fmt.Errorf("pinmem: AllocShared with %s: only Portable, Mapped and ReadOnly apply to shared memory: %w", flags, cuda.ErrInvalidValue)
	}
	var b *Buffer
	if err == nil {
		var fd int
		fd, err = unix.MemfdCreate("pinmem", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			err = fmt.Errorf("pinmem: memfd_create: %w", err)
		} else {
			length := roundUp(uintptr(size), pageSize)
			if err = unix.Ftruncate(fd, int64(length)); err != nil {
				err = fmt.Errorf("pinmem: ftruncate of the memfd to %d bytes: %w", length, err)
			} else if _, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sizeSeals|unix.F_SEAL_SEAL); err != nil {
				err = fmt.Errorf("pinmem: sealing the memfd's size: %w", err)
			} else {
				b, err = pinShared(fd, size, length, flags, o)
			}
			if err != nil {
				_ = unix.Close(fd)
			}
		}
	}
	if err != nil {
		ledgerFailed()
		return nil, err
	}
	return b, nil
}

// sizeSeals are the seals of a shared buffer's file: its size is fixed, so
// that a mapping of it never has pages cut from under it (an access past a
// shrunk file's end is SIGBUS).
const sizeSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// pinShared maps the file fd (length bytes) shared and registers it as a
// buffer of size bytes; the buffer owns fd from then on.
func pinShared(fd int, size int, length uintptr, flags Flags, o options) (*Buffer, error) {
	t, err := resolve(o)
	if err != nil {
		return nil, err
	}
	if err := checkDeviceFlags(t, flags, true); err != nil {
		return nil, err
	}
	n := int64(length)
	limit, before, err := reserve(n)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	p, err := unix.MmapPtr(fd, 0, nil, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unreserve(n)
		if isENOMEM(err) {
			return nil, &OutOfMemoryError{Op: "mmap", Requested: n, Pinned: before, Limit: limit, Err: err}
		}
		return nil, fmt.Errorf("pinmem: mmap of the shared file (%d bytes): %w", length, err)
	}
	liveMappings.Add(1)
	var chunks []chunk
	err = t.do(func() (err error) {
		chunks, err = registerChunks(t, p, length, flags)
		return err
	})
	if err != nil {
		if len(chunks) > 0 {
			keepOrphan(&bufState{t: t, ptr: p, size: size, kind: KindMmapRegister, flags: flags, mapLen: length, chunks: chunks}, n)
		} else {
			_ = unmapAnon(p, length)
			unreserve(n)
		}
		return nil, driverErr("cuMemHostRegister", fmt.Sprintf("flags %s, shared mapping", flags), err, n, before, limit)
	}
	lo := uintptr(p)
	if err := regInsert(lo, lo+length, flags&ReadOnly != 0); err != nil {
		var left []chunk
		uerr := t.do(func() (err error) { left, err = unregisterChunks(t, chunks); return err })
		if len(left) > 0 {
			keepOrphan(&bufState{t: t, ptr: p, size: size, kind: KindMmapRegister, flags: flags, mapLen: length, chunks: left}, n)
		} else {
			_ = unmapAnon(p, length)
			unreserve(n)
		}
		return nil, errors.Join(err, uerr)
	}
	s := &bufState{t: t, ptr: p, size: size, pinned: n, kind: KindMmapRegister, flags: flags,
		mapLen: length, chunks: chunks, regLo: lo, regHi: lo + length, shared: &sharedFile{fd: fd}}
	ledgerAdd(s.kind, flags, n, time.Since(start))
	return newBuffer(s), nil
}

// SendShared sends b, a buffer from AllocShared or ReceiveShared, over
// conn: its file (SCM_RIGHTS) with its size and flags, in one message,
// bounded by ctx. b stays the sender's to use and free.
func SendShared(ctx context.Context, conn *net.UnixConn, b *Buffer) error {
	s, err := b.live()
	if err != nil {
		return err
	}
	if s.shared == nil {
		return fmt.Errorf("pinmem: SendShared of %v: not a shared buffer (allocate it with AllocShared): %w", b, cuda.ErrInvalidValue)
	}
	undo, err := bindCtx(ctx, conn, true)
	if err != nil {
		return err
	}
	defer undo()
	msg := shareMsg(s.size, s.flags, s.mapLen)
	s.relMu.Lock() // the file stays open while it is sent
	defer s.relMu.Unlock()
	if s.released {
		return fmt.Errorf("pinmem: SendShared: %w", ErrFreed)
	}
	if _, _, err := conn.WriteMsgUnix(msg, unix.UnixRights(s.shared.fd), nil); err != nil {
		return fmt.Errorf("pinmem: SendShared: %w", ctxErr(ctx, err))
	}
	return nil
}

// ReceiveShared receives a buffer that another process sent with
// SendShared, bounded by ctx, maps it and registers it in this process:
// the Buffer is this process's (counted by its ledger and budget, freed
// with Free), its memory the sender's. size is the size expected (0: any)
// and flags the flags expected; a message that does not match, is not
// SendShared's, or carries a file that its sender could shrink (not
// AllocShared's sealed memfd), matches ErrShareMismatch; a size over the
// budget is a *BudgetError. Nothing is left mapped or open on error.
func ReceiveShared(ctx context.Context, conn *net.UnixConn, size int, flags Flags, opts ...Option) (*Buffer, error) {
	o, err := buildOptions("pinmem.ReceiveShared", opts)
	if err != nil {
		return nil, err
	}
	undo, err := bindCtx(ctx, conn, false)
	if err != nil {
		return nil, err
	}
	msg := make([]byte, shareMsgLen+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(msg, oob)
	undo()
	fds := rightsFDs(oob[:oobn])
	fail := func(e error) (*Buffer, error) {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		ledgerFailed()
		return nil, e
	}
	if err != nil {
		return fail(fmt.Errorf("pinmem: ReceiveShared: %w", ctxErr(ctx, err)))
	}
	le := binary.LittleEndian
	switch {
	case n != shareMsgLen || le.Uint32(msg) != shareMagic || le.Uint32(msg[4:]) != shareVersion:
		return fail(mismatch("message", fmt.Sprintf("SendShared's (%d bytes, version %d)", shareMsgLen, shareVersion), fmt.Sprintf("%d bytes", n)))
	case len(fds) != 1:
		return fail(mismatch("file", "one file descriptor", fmt.Sprintf("%d", len(fds))))
	}
	gotSize, gotFlags, length := le.Uint64(msg[8:]), Flags(le.Uint32(msg[16:])), uintptr(le.Uint64(msg[24:]))
	if size != 0 && uint64(size) != gotSize {
		return fail(mismatch("size", fmtBytes(int64(size)), fmtBytes(int64(gotSize))))
	}
	if gotFlags != flags {
		return fail(mismatch("flags", flags.String(), gotFlags.String()))
	}
	if err := checkSize("ReceiveShared", int(gotSize)); err != nil || length != roundUp(uintptr(gotSize), pageSize) {
		return fail(mismatch("size", "1.."+fmtBytes(MaxSize)+" rounded up to pages", fmt.Sprintf("%d bytes in a mapping of %d", gotSize, length)))
	}
	if err := checkSharedFile(fds[0], length); err != nil {
		return fail(err)
	}
	b, err := pinShared(fds[0], int(gotSize), length, gotFlags, o)
	if err != nil {
		return fail(err)
	}
	return b, nil
}

// checkSharedFile checks that fd, a received file, has length bytes and a
// size its sender cannot shrink (AllocShared's sealed memfd).
func checkSharedFile(fd int, length uintptr) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != int64(length) {
		return mismatch("file", fmt.Sprintf("%d bytes", length), fmt.Sprintf("%d bytes (fstat: %v)", st.Size, err))
	}
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return mismatch("file", "a memfd sealed against shrinking (AllocShared's)", fmt.Sprintf("seals %#x (%v): its sender could cut the pages from under this process", seals, err))
	}
	return nil
}

// rightsFDs returns the file descriptors that the control messages oob
// carry as SCM_RIGHTS, skipping what does not parse; ReceiveShared closes
// them on error.
func rightsFDs(oob []byte) []int {
	var fds []int
	if len(oob) > 0 {
		if cms, perr := unix.ParseSocketControlMessage(oob); perr == nil {
			for _, cm := range cms {
				if got, err := unix.ParseUnixRights(&cm); err == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	return fds
}

// shareMsg is SendShared's message beside the file: magic, version, the
// buffer's size, its flags and the length of its mapping.
func shareMsg(size int, flags Flags, mapLen uintptr) []byte {
	msg := make([]byte, shareMsgLen)
	binary.LittleEndian.PutUint32(msg[0:], shareMagic)
	binary.LittleEndian.PutUint32(msg[4:], shareVersion)
	binary.LittleEndian.PutUint64(msg[8:], uint64(size))
	binary.LittleEndian.PutUint32(msg[16:], uint32(flags))
	binary.LittleEndian.PutUint64(msg[24:], uint64(mapLen))
	return msg
}
