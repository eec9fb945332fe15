package remote

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
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
// open and its agent runs.
func (r *Region) Key() []byte {
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
	bad := func(format string, args ...any) error {
		return &Error{Op: "remote.Agent.Import", Kind: ErrBadKey, Detail: fmt.Sprintf(format, args...)}
	}
	if len(b) < keyHeaderSize+4+4+4 {
		return nil, bad("%d bytes: shorter than any key", len(b))
	}
	if string(b[:4]) != keyMagic {
		return nil, bad("no key magic (got %q)", b[:4])
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, bad("checksum %#08x, the key says %#08x (truncated or corrupt)", got, sum)
	}
	if b[4] != keyVersion {
		return nil, bad("key version %d, this build reads %d", b[4], keyVersion)
	}
	if b[5] != backendUCX {
		return nil, bad("backend %d, this build has UCX (%d) only", b[5], backendUCX)
	}
	le := binary.LittleEndian
	k := &key{agent: le.Uint64(b[8:]), slab: le.Uint64(b[16:]), addr: le.Uint64(b[24:]), n: le.Uint64(b[32:])}
	rest := body[keyHeaderSize:]
	take := func(n int, what string) ([]byte, error) {
		if n > len(rest) {
			return nil, bad("%s of %d bytes runs past the key's end", what, n)
		}
		v := rest[:n]
		rest = rest[n:]
		return v, nil
	}
	v, err := take(4, "worker address length")
	if err != nil {
		return nil, err
	}
	if n := le.Uint32(v); n == 0 || n > keyMaxAddr {
		return nil, bad("worker address of %d bytes", n)
	} else if v, err = take(int(n), "worker address"); err != nil {
		return nil, err
	}
	k.worker = append([]byte(nil), v...)
	if v, err = take(4, "registration count"); err != nil {
		return nil, err
	}
	np := le.Uint32(v)
	if np == 0 || np > keyMaxPieces {
		return nil, bad("%d registrations", np)
	}
	next := k.addr
	for i := range int(np) {
		if v, err = take(20, "registration"); err != nil {
			return nil, err
		}
		p := keyPiece{addr: le.Uint64(v), n: le.Uint64(v[8:])}
		rl := le.Uint32(v[16:])
		if rl == 0 || rl > keyMaxRkey {
			return nil, bad("registration %d: remote key of %d bytes", i, rl)
		}
		if v, err = take(int(rl), "remote key"); err != nil {
			return nil, err
		}
		p.rkey = append([]byte(nil), v...)
		if p.n == 0 || p.addr+p.n < p.addr || p.addr > next || (i == 0 && p.addr > k.addr) {
			return nil, bad("registration %d [%#x, +%d) does not continue the region at %#x", i, p.addr, p.n, next)
		}
		next = p.addr + p.n
		k.pieces = append(k.pieces, p)
	}
	if len(rest) != 0 {
		return nil, bad("%d bytes after the last registration", len(rest))
	}
	if k.n == 0 || k.addr+k.n < k.addr || next < k.addr+k.n {
		return nil, bad("region [%#x, +%d) not covered by its registrations (they end at %#x)", k.addr, k.n, next)
	}
	return k, nil
}
