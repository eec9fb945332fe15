package remote

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/pinmem/pinmem/remote/internal/ucx"
)

// A remote key is what an agent sends so that another can reach a region:
// the backend, the owning agent's identity and worker address, the
// region's address and length, and for each registration under it its
// range and packed UCX remote key, followed by a CRC-32C of all of it.
// Little-endian:
//
//	"PMRK" version:u8 backend:u8 0:u16 agent:u64 slab:u64 addr:u64 len:u64
//	addrLen:u32 workerAddress npieces:u32 {addr:u64 len:u64 rkeyLen:u32 rkey}... crc:u32
const (
	keyMagic      = "PMRK"
	keyVersion    = 1
	backendUCX    = 1
	keyMaxAddr    = 1 << 16 // bound on a worker address
	keyMaxRkey    = 1 << 16 // bound on one packed rkey
	keyMaxPieces  = 1 << 16
	keyHeaderSize = 4 + 1 + 1 + 2 + 8*4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// key is a parsed remote key.
type key struct {
	agent, slab uint64
	addr, n     uint64
	worker      []byte
	pieces      []keyPiece
}

type keyPiece struct {
	addr, n uint64
	rkey    []byte
}

// Key returns the region's remote key: bytes to send to another agent,
// which passes them to Import. The key stays valid while the region is
// open and its agent runs (nil for a nil Region).
func (r *Region) Key() []byte {
	if !r.ok() {
		return nil
	}
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	b := make([]byte, 0, 256)
	b = append(b, keyMagic...)
	b = append(b, keyVersion, backendUCX, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, a.id)
	b = binary.LittleEndian.AppendUint64(b, r.s.id)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.s.base+r.off))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.n))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(a.addr)))
	b = append(b, a.addr...)
	var ps []piece
	for _, p := range r.s.pieces {
		if p.off < r.off+r.n && p.off+p.n > r.off {
			ps = append(ps, p)
		}
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ps)))
	for _, p := range ps {
		b = binary.LittleEndian.AppendUint64(b, uint64(r.s.base+p.off))
		b = binary.LittleEndian.AppendUint64(b, uint64(p.n))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p.rkey)))
		b = append(b, p.rkey...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseKey checks and parses a remote key; every failure matches ErrBadKey.
func parseKey(b []byte) (*key, error) {
	body, err := checkKeyFrame(b)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	k := &key{agent: le.Uint64(b[8:]), slab: le.Uint64(b[16:]), addr: le.Uint64(b[24:]), n: le.Uint64(b[32:])}
	r := &keyReader{rest: body[keyHeaderSize:]}
	if k.worker, err = r.worker(); err != nil {
		return nil, err
	}
	next, err := r.pieces(k)
	if err != nil {
		return nil, err
	}
	if len(r.rest) != 0 {
		return nil, badKey("%d bytes after the last registration", len(r.rest))
	}
	if k.n > math.MaxInt64 { // Remote.Len and the blocks' range checks are int64
		return nil, badKey("region of %d bytes", k.n)
	}
	if k.n == 0 || k.addr+k.n < k.addr || next < k.addr+k.n {
		return nil, badKey("region [%#x, +%d) not covered by its registrations (they end at %#x)", k.addr, k.n, next)
	}
	return k, nil
}

// badKey returns the ErrBadKey error parseKey and its helpers report, with
// the detail formatted from format and args.
func badKey(format string, args ...any) error {
	return &Error{Op: "remote.Agent.Import", Kind: ErrBadKey, Detail: fmt.Sprintf(format, args...)}
}

// checkKeyFrame checks a key's length, magic, checksum, version and backend,
// and returns the key without its trailing checksum.
func checkKeyFrame(b []byte) ([]byte, error) {
	if len(b) < keyHeaderSize+4+4+4 {
		return nil, badKey("%d bytes: shorter than any key", len(b))
	}
	if string(b[:4]) != keyMagic {
		return nil, badKey("no key magic (got %q)", b[:4])
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, badKey("checksum %#08x, the key says %#08x (truncated or corrupt)", got, sum)
	}
	if b[4] != keyVersion {
		return nil, badKey("key version %d, this build reads %d", b[4], keyVersion)
	}
	if b[5] != backendUCX {
		return nil, badKey("backend %d, this build has UCX (%d) only", b[5], backendUCX)
	}
	return body, nil
}

// keyReader reads the variable-length part of a key, after its header.
type keyReader struct {
	rest []byte // what is left to read
}

// take returns the next n bytes, described as what in the error if the key
// ends before them.
func (r *keyReader) take(n int, what string) ([]byte, error) {
	if n > len(r.rest) {
		return nil, badKey("%s of %d bytes runs past the key's end", what, n)
	}
	v := r.rest[:n]
	r.rest = r.rest[n:]
	return v, nil
}

// worker reads the length-prefixed worker address and returns a copy of it.
func (r *keyReader) worker() ([]byte, error) {
	v, err := r.take(4, "worker address length")
	if err != nil {
		return nil, err
	}
	if n := binary.LittleEndian.Uint32(v); n == 0 || n > keyMaxAddr {
		return nil, badKey("worker address of %d bytes", n)
	} else if v, err = r.take(int(n), "worker address"); err != nil {
		return nil, err
	}
	return append([]byte(nil), v...), nil
}

// pieces reads the count-prefixed registrations into k.pieces, checking that
// each continues the region from k.addr, and returns where the last one ends.
func (r *keyReader) pieces(k *key) (uint64, error) {
	v, err := r.take(4, "registration count")
	if err != nil {
		return 0, err
	}
	np := binary.LittleEndian.Uint32(v)
	if np == 0 || np > keyMaxPieces {
		return 0, badKey("%d registrations", np)
	}
	next := k.addr
	for i := range int(np) {
		p, err := r.piece(i)
		if err != nil {
			return 0, err
		}
		if p.n == 0 || p.addr+p.n < p.addr || p.addr > next || (i == 0 && p.addr > k.addr) {
			return 0, badKey("registration %d [%#x, +%d) does not continue the region at %#x", i, p.addr, p.n, next)
		}
		next = p.addr + p.n
		k.pieces = append(k.pieces, p)
	}
	return next, nil
}

// piece reads registration i: its address, length and a copy of its remote key.
func (r *keyReader) piece(i int) (keyPiece, error) {
	le := binary.LittleEndian
	v, err := r.take(20, "registration")
	if err != nil {
		return keyPiece{}, err
	}
	p := keyPiece{addr: le.Uint64(v), n: le.Uint64(v[8:])}
	rl := le.Uint32(v[16:])
	if rl == 0 || rl > keyMaxRkey {
		return keyPiece{}, badKey("registration %d: remote key of %d bytes", i, rl)
	}
	if v, err = r.take(int(rl), "remote key"); err != nil {
		return keyPiece{}, err
	}
	if err := ucx.CheckRkey(v); err != nil {
		return keyPiece{}, badKey("registration %d: %v", i, err)
	}
	p.rkey = append([]byte(nil), v...)
	return p, nil
}
