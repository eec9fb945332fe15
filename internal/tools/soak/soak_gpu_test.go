package soak_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/pool"
	"github.com/pinmem/pinmem/transfer"
)

// EnvSoakSeconds sets the soak's duration; without it TestGPUSoak skips.
const envSoakSeconds = "PINMEM_SOAK_SECONDS"

var crcTable = crc64.MakeTable(crc64.ECMA)

// soakCounts are the soak's tallies, reported at the end.
type soakCounts struct {
	poolOps, copies, pipelines, canceled, copiedBytes atomic.Int64
}

// TestGPUSoak runs for PINMEM_SOAK_SECONDS: 64 goroutines Get and Put pool
// blocks of random sizes, each tagging its block and checking the tag
// survived (a block handed out twice would be caught); 8 goroutines copy
// random sizes at random device offsets both ways through a shared
// Copier and their own (one of them with a registration cache smaller
// than what it copies, so that it evicts), checking every byte; 2
// goroutines run Pipelines over random inputs with random deadlines,
// checking every completed run byte for byte and every interrupted one for
// a context error. At the end everything is closed: the ledger and the
// host's Shmem and MemAvailable are back to their baseline. What the
// process holds (accounting_test.go: Go heap, RSS, ledger, pool,
// registration caches, driver objects) is reported at the start, middle
// and end and sampled throughout: the peaks of the resident set, the live
// Go heap and the streams, events and device allocations in the second
// half may not exceed those of the first by more than 10% (the working
// set is reached early; growth after that is a leak).
func TestGPUSoak(t *testing.T) {
	secs, _ := strconv.Atoi(os.Getenv(envSoakSeconds))
	if secs <= 0 {
		t.Skipf("set %s to run the soak", envSoakSeconds)
	}
	soak(t, testutil.GPUContext(t), secs)
}

// TestSoakOnFake runs the soak on the fake driver, for ten seconds or
// PINMEM_SOAK_FAKE_SECONDS, with the same accounting and checks: it proves
// the checks work and that pinmem's own bookkeeping does not grow (Go
// heap, RSS, pinned bytes, driver objects), not that data moved on a GPU.
func TestSoakOnFake(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	secs := 10
	if v, err := strconv.Atoi(os.Getenv(envSoakFakeSeconds)); err == nil && v > 0 {
		secs = v
	}
	testutil.UseFake(t, fakedrv.Options{})
	soak(t, testutil.PrimaryContext(t), secs)
}

// soakCacheLimit is the registration cache's limit in the soak: less than
// the 128 MiB of Go buffers its Copier copies, so that it evicts.
const soakCacheLimit = 96 << 20

// envSoakFakeSeconds sets TestSoakOnFake's duration (default 10 s).
const envSoakFakeSeconds = "PINMEM_SOAK_FAKE_SECONDS"

func soak(t *testing.T, gctx *cuda.Context, secs int) {
	runtime.GC()
	baseLedger := pinmem.Stats().Pinned.Bytes
	baseMem := meminfo(t)
	var own owners
	start := own.measure()
	t.Logf("SOAK: start: %v", start)
	// The clock starts once every worker has set up (made and written
	// its buffers), so that both halves run at the working set.
	var began, deadline time.Time
	var ready sync.WaitGroup
	run := make(chan struct{}) // closed when the clock starts
	stopSampling := make(chan struct{})
	var n soakCounts
	// Each part runs until the deadline and, on a slow host (the race
	// detector on two cores), on until it has finished at least once, for at
	// most a minute more.
	more := func(done *atomic.Int64) bool {
		now := time.Now()
		return now.Before(deadline) || (done.Load() == 0 && now.Before(deadline.Add(time.Minute)))
	}
	errc := make(chan error, 128)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}

	p, err := pool.New(pool.WithName("soak"), pool.WithMaxCached(512<<20))
	if err != nil {
		t.Fatal(err)
	}
	shared, err := transfer.New(gctx)
	if err != nil {
		t.Fatal(err)
	}
	own.pool = p
	own.add(shared)
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-run
			r := rand.New(rand.NewPCG(uint64(g), 1))
			var streams []*cuda.Stream
			for more(&n.poolOps) {
				size := 1 + r.IntN(8<<20)
				if r.IntN(4) == 0 {
					size = 1 + r.IntN(64<<10)
				}
				b, err := p.Get(context.Background(), size)
				if err != nil {
					report(fmt.Errorf("pool Get(%d): %w", size, err))
					return
				}
				mem := b.Bytes()[:size]
				tag := byte(g + 1)
				for i := 0; i < size; i += 512 {
					mem[i] = tag
				}
				mem[size-1] = tag
				runtime.Gosched()
				for i := 0; i < size; i += 512 {
					if mem[i] != tag {
						report(fmt.Errorf("pool block of %d bytes: byte %d is %d, not this goroutine's tag %d: handed out twice", size, i, mem[i], tag))
						return
					}
				}
				if err := p.Put(b, streams...); err != nil {
					report(fmt.Errorf("pool Put: %w", err))
					return
				}
				n.poolOps.Add(1)
			}
		}()
	}
	for g := range 8 {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			set := sync.OnceFunc(ready.Done)
			defer set()
			cp := shared
			if g%2 == 1 {
				var opts []transfer.Option
				if g == 1 {
					// Registers the Go slices it copies in place, within
					// its limit: idle registrations are evicted, least
					// recently used first, to make room.
					opts = append(opts, transfer.WithRegistrationCache(soakCacheLimit))
				}
				mine, err := transfer.New(gctx, opts...)
				if err != nil {
					report(err)
					return
				}
				own.add(mine)
				defer func() {
					own.remove(mine)
					if err := mine.Close(context.Background()); err != nil {
						report(err)
					}
				}()
				cp = mine
			}
			const devSize = 96 << 20
			dev, err := gctx.Alloc(devSize)
			if err != nil {
				report(err)
				return
			}
			defer dev.Free()
			r := rand.New(rand.NewPCG(uint64(g), 2))
			src := make([]byte, 64<<20+4096)
			dst := make([]byte, len(src))
			// Every page written once now, so that the working set is
			// reached at the start and the halves compare like with like
			// (random sizes would otherwise touch the buffers' last pages,
			// and the fake device's, only as the run goes on).
			fillRandom(src, r)
			fillRandom(dst, r)
			if err := dev.Memset(0); err != nil {
				report(err)
				return
			}
			set()
			<-run
			for more(&n.copies) {
				size := 1 + r.IntN(64<<20)
				if r.IntN(3) == 0 {
					size = 1 + r.IntN(256<<10)
				}
				hoff, doff := r.IntN(4096), r.IntN(devSize-size+1)
				in := src[hoff : hoff+size]
				for i := 0; i+8 <= size; i += 8 * 61 {
					in[i] = byte(r.Uint32())
				}
				in[size-1] = byte(r.Uint32())
				want := crc64.Checksum(in, crcTable)
				view, err := dev.Slice(doff, size)
				if err != nil {
					report(err)
					return
				}
				if _, err := cp.HtoD(context.Background(), view, in); err != nil {
					report(fmt.Errorf("HtoD %d bytes: %w", size, err))
					return
				}
				out := dst[hoff : hoff+size]
				clear(out)
				if _, err := cp.DtoH(context.Background(), out, view); err != nil {
					report(fmt.Errorf("DtoH %d bytes: %w", size, err))
					return
				}
				if got := crc64.Checksum(out, crcTable); got != want || !bytes.Equal(out, in) {
					report(fmt.Errorf("round trip of %d bytes (host offset %d, device offset %d) corrupted at byte %d", size, hoff, doff, testutil.FirstMismatch(in, out)))
					return
				}
				n.copies.Add(1)
				n.copiedBytes.Add(2 * int64(size))
			}
		}()
	}
	for g := range 2 {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			set := sync.OnceFunc(ready.Done)
			defer set()
			pl, err := shared.NewPipeline(transfer.WithChunkSize(4<<20), transfer.WithStreams(3), transfer.WithPinStages(true))
			if err != nil {
				report(err)
				return
			}
			defer func() {
				if err := pl.Close(context.Background()); err != nil {
					report(err)
				}
			}()
			r := rand.New(rand.NewPCG(uint64(g), 3))
			// The buffers are allocated once and used at random lengths,
			// as the copies' are: buffers of random sizes allocated per
			// Run would make the Go heap's own retention of freed spans
			// what the RSS check measures.
			const maxSize = 48 << 20
			inBuf, outBuf := make([]byte, maxSize), make([]byte, maxSize)
			fillRandom(inBuf, r) // every page now, as the copies' buffers
			fillRandom(outBuf, r)
			set()
			<-run
			for more(&n.pipelines) {
				size := 1 + r.IntN(maxSize)
				in, out := inBuf[:size], outBuf[:size]
				fillRandom(in, r)
				clear(out)
				ctx, cancel := context.Background(), func() {}
				limited := r.IntN(3) == 0
				if limited {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(1+r.IntN(20))*time.Millisecond)
				}
				_, err := pl.Run(ctx, in, out)
				cancel()
				switch {
				case err == nil:
					if !bytes.Equal(in, out) {
						report(fmt.Errorf("pipeline of %d bytes corrupted at byte %d", size, testutil.FirstMismatch(in, out)))
						return
					}
					n.pipelines.Add(1)
				case limited && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
					n.canceled.Add(1)
				default:
					report(fmt.Errorf("pipeline of %d bytes: %w", size, err))
					return
				}
			}
		}()
	}
	ready.Wait()
	began = time.Now()
	deadline = began.Add(time.Duration(secs) * time.Second)
	sampled := sample(&own, began, time.Duration(secs)*time.Second, stopSampling)
	close(run)
	wg.Wait()
	close(stopSampling)
	<-sampled.done
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	end := own.measure()
	t.Logf("SOAK: middle: %v", sampled.middle)
	t.Logf("SOAK: end: %v", end)
	own.remove(shared)
	if err := shared.Close(context.Background()); err != nil {
		t.Error(err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Error(err)
	}
	own.pool = nil
	runtime.GC()
	t.Logf("SOAK: after Close: %v", own.measure())
	// The Go runtime keeps the heap the soak's buffers freed resident until
	// its scavenger returns it, minutes later: give it back now, so that
	// MemAvailable and RSS below show what pinmem and the driver kept.
	debug.FreeOSMemory()
	t.Logf("SOAK: after Close, the freed Go heap returned to the OS: %v", own.measure())
	ledger := pinmem.Stats().Pinned.Bytes
	var after *sysinfo.Meminfo
	// Nothing signals when the driver has returned the pages: poll, bounded
	// at 5 s.
	for i := 0; ; i++ {
		after = meminfo(t)
		if int64(after.Shmem)-int64(baseMem.Shmem) < 64<<20 || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("SOAK: %d s: %d pool Get/Put, %d checked round trips (%.1f GB moved), %d checked pipelines, %d pipelines stopped by their deadline",
		secs, n.poolOps.Load(), n.copies.Load(), float64(n.copiedBytes.Load())/1e9, n.pipelines.Load(), n.canceled.Load())
	t.Logf("SOAK: RSS start %d MiB, end %d MiB; ledger %d bytes after Close (baseline %d); Shmem %+d MiB, MemAvailable %+d MiB against the baseline",
		start.rss>>20, end.rss>>20, ledger, baseLedger, (int64(after.Shmem)-int64(baseMem.Shmem))>>20, (int64(after.MemAvailable)-int64(baseMem.MemAvailable))>>20)
	t.Logf("SOAK: peaks in the first half: RSS %d MiB, Go heap %d MiB, pinned %d MiB, %d streams, events and device allocations; in the second: RSS %d MiB, Go heap %d MiB, pinned %d MiB, %d streams, events and device allocations",
		sampled.first.rss>>20, sampled.first.heapInuse>>20, sampled.first.pinned>>20, sampled.first.objects,
		sampled.second.rss>>20, sampled.second.heapInuse>>20, sampled.second.pinned>>20, sampled.second.objects)
	for _, err := range sampled.growth() {
		t.Error(err)
	}
	if c := max(sampled.first.cachedBytes, sampled.second.cachedBytes); c > soakCacheLimit {
		t.Errorf("the registration cache held %d MiB, above its limit of %d MiB", c>>20, soakCacheLimit>>20)
	}
	if ledger != baseLedger {
		t.Errorf("ledger %d bytes after Close, want the baseline %d", ledger, baseLedger)
	}
	if n.poolOps.Load() == 0 || n.copies.Load() == 0 || n.pipelines.Load() == 0 {
		t.Error("a part of the soak did no work")
	}
	if d := int64(after.Shmem) - int64(baseMem.Shmem); d > 64<<20 {
		t.Errorf("Shmem %d MiB above its baseline after Close", d>>20)
	}
}

// fillRandom fills b with bytes from r.
func fillRandom(b []byte, r *rand.Rand) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}
