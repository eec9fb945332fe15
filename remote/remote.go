package remote

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/remote/internal/ucx"
)

// Block is one range of a transfer: Len bytes at offset Local of the local
// region and offset Remote of the remote region. A transfer takes a list of
// them: one call moves any number of blocks with one completion.
type Block struct {
	Local, Remote, Len int64
}

// Remote is another agent's region, imported from its key: the target of
// Put and the source of Get. Remotes of one agent share one connection.
type Remote struct {
	a      *Agent
	p      *peer
	k      *key
	rkeys  []ucx.Rkey // per key piece; nil once closed or failed (thread)
	busy   int        // transfers in flight (thread)
	closed atomic.Bool
}

// peer is a connection to another agent's worker.
type peer struct {
	addr    string
	ep      ucx.Ep
	peerErr bool // created with UCP's peer error handling (a force close cancels its requests)
	remotes map[*Remote]struct{}
	failed  string // why it failed; "" while usable
	// inflight counts the ops in flight on the endpoint. A failed peer
	// keeps its endpoint until they ended: UCX cannot take back bytes
	// already sent, so a connection is closed, and a new one to the same
	// agent made, only once every byte of the old one landed.
	inflight  int
	drained   chan struct{} // closed once the peer failed and no op is in flight
	isDrained bool
}

// op is a transfer in flight: its flush request, checked by the thread.
type op struct {
	req    ucx.Request
	name   string
	p      *peer
	local  *slab
	remote *Remote
	err    error
	here   bool   // the connection had already failed (for any reason) when the op ended
	after  func() // run by finish once the op no longer counts (thread)
	done   chan struct{}
}

// Import connects to the agent that made key (once per agent: later
// imports of its keys share the connection) and returns its region. A key
// that is not one is an error matching ErrBadKey; one whose agent cannot
// be reached (it exited, was killed or closed) or whose region was closed
// matches ErrStaleKey. The connection is checked before Import returns,
// bounded by ctx.
func (a *Agent) Import(ctx context.Context, key []byte) (*Remote, error) {
	const opName = "remote.Agent.Import"
	if !a.ok() {
		return nil, errNil(opName, "Agent")
	}
	k, err := parseKey(key)
	if err != nil {
		return nil, err
	}
	if err := staleInProcess(opName, k); err != nil {
		return nil, err
	}
	var r *Remote
	var check *op
	var drain <-chan struct{}
	job := func() (err error) {
		r, check, drain, err = a.importOnThread(opName, k)
		return err
	}
	for {
		if err = a.do(ctx, opName, job); err != nil {
			return nil, err
		}
		if drain == nil {
			break
		}
		// An earlier connection to the key's agent failed with transfers
		// in flight (cut short by their contexts): a new connection waits
		// until they ended, so that no byte of theirs lands after a
		// transfer on the new one.
		select {
		case <-drain:
		case <-ctx.Done():
			return nil, &Error{Op: opName, Kind: ctx.Err(), Detail: "an earlier connection to the key's agent still has transfers in flight that were cut short; a new one waits for them to end", Err: ctx.Err()}
		}
	}
	if check != nil {
		if err := a.checkImport(ctx, opName, r, check); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// importOnThread is Import's part on the agent's thread: it returns the
// remote region of k, on the agent's connection to k's agent (made now,
// with the op that checks it, when there is none), or the channel to wait
// on before a new connection when the last one failed and still has
// transfers in flight.
func (a *Agent) importOnThread(opName string, k *key) (r *Remote, check *op, drain <-chan struct{}, err error) {
	p := a.peers[string(k.worker)]
	if p != nil && p.failed != "" && !p.isDrained {
		drain, err = a.drainOf(opName, k, p)
		return nil, nil, drain, err
	}
	fresh := p == nil || p.failed != ""
	if fresh {
		if p, err = a.connect(opName, k); err != nil {
			return nil, nil, nil, err
		}
	}
	r = &Remote{a: a, p: p, k: k}
	for i, kp := range k.pieces {
		rk, err := a.lib.RkeyUnpack(p.ep, kp.rkey)
		if err != nil {
			r.release(a)
			return nil, nil, nil, &Error{Op: opName, Kind: ErrBadKey, Detail: fmt.Sprintf("registration %d's remote key", i), Err: err}
		}
		r.rkeys = append(r.rkeys, rk)
	}
	p.remotes[r] = struct{}{}
	if fresh {
		check = a.startOp(opName, p, nil, r, nil)
	}
	return r, check, nil, nil
}

// drainOf returns the channel that says when failed peer p, whose bytes
// may still land, has no transfer in flight (agent's thread). Over shared
// memory UCX never ends the transfers to an agent that died, so they
// would never drain: an endpoint it cannot make says the agent is gone
// (made, it shows the agent is there, and is closed unused).
func (a *Agent) drainOf(opName string, k *key, p *peer) (<-chan struct{}, error) {
	if !p.peerErr {
		ep, err := a.lib.EpCreate(a.w, k.worker, false)
		if err != nil {
			return nil, &Error{Op: opName, Kind: ErrStaleKey, Detail: "cannot connect to the key's agent", Err: err}
		}
		(&peer{ep: ep}).close(a)
	}
	return p.drained, nil
}

// connect makes and records a connection to k's agent (agent's thread),
// with peer error handling where UCX offers it; shared memory has none:
// there a failed peer is seen by the context's end.
func (a *Agent) connect(opName string, k *key) (*peer, error) {
	peerErr := true
	ep, err := a.lib.EpCreate(a.w, k.worker, true)
	if e, ok := err.(*ucx.Error); ok && e.Status == ucx.ErrUnreachable {
		peerErr = false
		ep, err = a.lib.EpCreate(a.w, k.worker, false)
	}
	if err != nil {
		return nil, &Error{Op: opName, Kind: ErrStaleKey, Detail: "cannot connect to the key's agent", Err: err}
	}
	p := &peer{addr: string(k.worker), ep: ep, peerErr: peerErr, remotes: map[*Remote]struct{}{}, drained: make(chan struct{})}
	a.mu.Lock()
	a.peers[p.addr] = p
	a.mu.Unlock()
	return p, nil
}

// checkImport waits, bounded by ctx, for the check of r's new connection
// and closes r when it failed: ErrStaleKey when the key's agent cannot be
// reached, ErrPeer when another call on the connection failed or was cut
// short meanwhile (the agent is there: import again).
func (a *Agent) checkImport(ctx context.Context, opName string, r *Remote, check *op) error {
	err := a.wait(ctx, check)
	if err == nil && check.here {
		err = &Error{Op: opName, Kind: ErrPeer, Detail: "another call on the new connection failed or was cut short by its context meanwhile: import again"}
	}
	if err == nil {
		return nil
	}
	r.drop(check)
	if e, ok := err.(*Error); ok && e.Kind == ErrPeer && !check.here {
		e.Kind, e.Detail = ErrStaleKey, "the key's agent cannot be reached (it exited, was killed or closed)"
	}
	return err
}

// staleInProcess checks a key of an agent of this process against its
// regions (a key of another process is checked by connecting to it).
func staleInProcess(opName string, k *key) error {
	v, ok := agents.Load(k.agent)
	if !ok {
		return nil
	}
	a := v.(*Agent)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.slabs {
		if s.id == k.slab && !s.dead && s.refs > 0 {
			return nil
		}
	}
	return &Error{Op: opName, Kind: ErrStaleKey, Detail: fmt.Sprintf("the key's region (%d bytes at %#x) was closed or its buffer freed", k.n, k.addr)}
}

// ok reports whether r is a remote region Import made.
func (r *Remote) ok() bool { return r != nil && r.a != nil && r.k != nil }

// Len returns the remote region's size in bytes (0 for a nil Remote).
func (r *Remote) Len() int64 {
	if !r.ok() {
		return 0
	}
	return int64(r.k.n)
}

// Put writes each block of local to the remote region and returns once all
// of them have completed at the remote side (or failed), bounded by ctx.
// When ctx ends first, Put returns ctx's error and the connection to the
// remote agent is failed: later transfers on it fail with ErrPeer until
// the key is imported again. UCX cannot take back bytes already sent, so
// the Put goes on in the background: local stays busy (its buffer cannot
// be freed) and the blocks of the remote region may still change until it
// ended, and Import of the same agent's keys waits for that (bounded by
// its ctx), so that no byte of the cut-short Put lands after a transfer
// on the new connection.
func (r *Remote) Put(ctx context.Context, local *Region, blocks []Block) error {
	return r.transfer(ctx, "remote.Put", true, local, blocks)
}

// Get reads each block of the remote region into local; it completes and
// fails as Put does: after a Get cut short by ctx, the blocks of local
// may still change until it ended in the background.
func (r *Remote) Get(ctx context.Context, local *Region, blocks []Block) error {
	return r.transfer(ctx, "remote.Get", false, local, blocks)
}

func (r *Remote) transfer(ctx context.Context, name string, put bool, local *Region, blocks []Block) error {
	if !r.ok() {
		return errNil(name, "Remote")
	}
	if ctx == nil || !local.ok() {
		return &Error{Op: name, Kind: cuda.ErrInvalidValue, Detail: "nil context, or nil or zero region"}
	}
	a := r.a
	if local.a != a {
		return &Error{Op: name, Kind: cuda.ErrInvalidValue, Detail: "the local region belongs to another agent"}
	}
	if r.closed.Load() {
		return &Error{Op: name, Kind: ErrClosed, Detail: "the remote region is closed"}
	}
	for i, b := range blocks {
		if b.Len <= 0 || b.Local < 0 || b.Remote < 0 || b.Local > local.Len()-b.Len || b.Remote > r.Len()-b.Len {
			return &Error{Op: name, Kind: ErrOutOfRange, Detail: fmt.Sprintf("block %d {Local %d, Remote %d, Len %d}: local region %d bytes, remote region %d bytes", i, b.Local, b.Remote, b.Len, local.Len(), r.Len())}
		}
	}
	if len(blocks) == 0 {
		return nil
	}
	if err := staleInProcess(name, r.k); err != nil {
		return err
	}
	var o *op
	err := a.do(ctx, name, func() error {
		a.mu.Lock()
		err := local.live(name)
		a.mu.Unlock()
		if err != nil {
			return err
		}
		if r.closed.Load() { // by a Close queued before this job
			return &Error{Op: name, Kind: ErrClosed, Detail: "the remote region is closed"}
		}
		if r.p.failed != "" || r.rkeys == nil {
			return &Error{Op: name, Kind: ErrPeer, Detail: "the connection failed earlier (" + r.p.failed + "): import the key again"}
		}
		var first error
		if err := r.issue(put, local, blocks); err != nil {
			first = &Error{Op: name, Kind: ErrPeer, Err: err}
		}
		o = a.startOp(name, r.p, local.s, r, first)
		return nil
	})
	if err != nil {
		return err
	}
	return a.wait(ctx, o)
}

// issue starts the puts or gets of blocks, cut where a block crosses from
// one registration to the next on either side (agent's thread). Requests
// are freed at once: the flush that follows says when they completed.
func (r *Remote) issue(put bool, local *Region, blocks []Block) error {
	lib := r.a.lib
	s := local.s
	for _, b := range blocks {
		la := s.base + local.off + uintptr(b.Local)
		ra := r.k.addr + uint64(b.Remote)
		n := uintptr(b.Len)
		for n > 0 {
			li := sort.Search(len(s.pieces), func(i int) bool { return s.base+s.pieces[i].off+s.pieces[i].n > la })
			ri := sort.Search(len(r.k.pieces), func(i int) bool { return r.k.pieces[i].addr+r.k.pieces[i].n > ra })
			lp, rp := s.pieces[li], r.k.pieces[ri]
			c := min(n, s.base+lp.off+lp.n-la, uintptr(rp.addr+rp.n-ra))
			var req ucx.Request
			var err error
			if put {
				req, err = lib.Put(r.p.ep, la, c, ra, r.rkeys[ri], lp.memh)
			} else {
				req, err = lib.Get(r.p.ep, la, c, ra, r.rkeys[ri], lp.memh)
			}
			if err != nil {
				return err
			}
			if req != 0 {
				lib.Free(req)
			}
			la, ra, n = la+c, ra+uint64(c), n-c
		}
	}
	return nil
}

// startOp flushes p's endpoint and tracks the flush as an op until it
// completes (agent's thread). local and r, if set, count it as in flight;
// first is an error the op already has (a block that failed to start).
func (a *Agent) startOp(name string, p *peer, local *slab, r *Remote, first error) *op {
	o := &op{name: name, p: p, local: local, remote: r, err: first, done: make(chan struct{})}
	req, err := a.lib.Flush(p.ep)
	if err != nil || req == 0 {
		if err != nil && o.err == nil {
			o.err = &Error{Op: name, Kind: ErrPeer, Err: err}
		}
		if o.err != nil {
			p.fail(a, name+" failed on it")
		}
		close(o.done)
		return o
	}
	o.req = req
	p.inflight++
	a.mu.Lock()
	if local != nil {
		local.busy++
	}
	if r != nil {
		r.busy++
	}
	a.mu.Unlock()
	a.ops = append(a.ops, o)
	return o
}

// checkOps completes the ops whose flush finished (agent's thread) and
// returns how many.
func (a *Agent) checkOps() int {
	done := 0
	kept := a.ops[:0]
	for _, o := range a.ops {
		st := a.lib.Check(o.req)
		if st == ucx.InProgress {
			kept = append(kept, o)
			continue
		}
		a.lib.Free(o.req)
		var err error
		if st != ucx.OK {
			err = &Error{Op: o.name, Kind: ErrPeer, Err: a.lib.Err("ucp_ep_flush_nbx", st)}
		}
		o.finish(a, err)
		done++
	}
	clear(a.ops[len(kept):])
	a.ops = kept
	return done
}

// finish completes o (agent's thread): it no longer counts as in flight,
// and a failed peer whose last op it was is closed. An op that failed
// fails its connection: UCX does not recover an endpoint once it failed,
// so an Import makes a new one rather than share it.
func (o *op) finish(a *Agent, err error) {
	o.here = o.p.failed != ""
	if err != nil || o.err != nil {
		o.p.fail(a, o.name+" failed on it")
	}
	o.p.inflight--
	o.p.closeIfDrained(a)
	a.mu.Lock()
	if o.local != nil {
		o.local.busy--
	}
	if o.remote != nil {
		o.remote.busy--
	}
	a.mu.Unlock()
	if o.after != nil {
		o.after()
	}
	if o.err == nil {
		o.err = err
	}
	close(o.done)
}

// wait waits for o, bounded by ctx. When ctx ends first, o's connection
// is failed (no transfer starts on it any more) and o goes on in the
// background, its regions busy (their buffers cannot be freed), until it
// ended or the agent closes: UCX cannot take back bytes already sent, so
// the connection is closed only then (peer.closeIfDrained).
func (a *Agent) wait(ctx context.Context, o *op) error {
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
	}
	select {
	case <-o.done: // it ended as ctx did: nothing was cut short
		return o.err
	default:
	}
	a.post(func() { o.p.fail(a, o.name+" was cut short by its context") }, true)
	return &Error{Op: o.name, Kind: ctx.Err(), Err: ctx.Err(),
		Detail: "the transfer goes on in the background, its regions busy, until it ended; import the key again (which waits for it)"}
}

// fail marks the connection failed (agent's thread): its remotes fail
// until imported again. The endpoint is closed once no op is in flight on
// it (closeIfDrained).
func (p *peer) fail(a *Agent, why string) {
	if p.failed != "" {
		return
	}
	p.failed = why
	p.closeIfDrained(a)
}

// closeIfDrained closes a failed peer's endpoint once no op is in flight
// on it, and says so to an Import waiting for it (agent's thread).
func (p *peer) closeIfDrained(a *Agent) {
	if p.failed == "" || p.inflight > 0 || p.isDrained {
		return
	}
	p.close(a)
	p.isDrained = true
	close(p.drained)
}

// close closes the endpoint and destroys the remote keys unpacked on it
// (agent's thread). With peer error handling the close is forced: it does
// not wait for the peer. Without, UCX allows only a close that flushes
// first: it is progressed a little and left to finish on its own (or at
// the worker's destruction).
func (p *peer) close(a *Agent) {
	if p.ep == 0 {
		return
	}
	req, _ := a.lib.EpClose(p.ep, p.peerErr)
	if req != 0 {
		for i := 0; i < 1000 && a.lib.Check(req) == ucx.InProgress; i++ {
			a.lib.Progress(a.w)
		}
		a.lib.Free(req)
	}
	for r := range p.remotes {
		for _, rk := range r.rkeys {
			a.lib.RkeyDestroy(rk)
		}
		r.rkeys = nil
	}
	a.mu.Lock()
	p.ep = 0
	a.mu.Unlock()
	if p.failed == "" {
		p.failed = "closed"
	}
}

// release destroys r's remote keys and drops it from its peer, closing the
// connection with its last remote (agent's thread).
func (r *Remote) release(a *Agent) {
	for _, rk := range r.rkeys {
		a.lib.RkeyDestroy(rk)
	}
	r.rkeys = nil
	delete(r.p.remotes, r)
	if len(r.p.remotes) == 0 {
		r.p.close(a)
		a.mu.Lock()
		if a.peers[r.p.addr] == r.p {
			delete(a.peers, r.p.addr)
		}
		a.mu.Unlock()
	}
}

// drop closes r, which Import does not return: its connection check o
// failed or was cut short. While o is still in flight (cut short over a
// transport without peer error handling), r is closed when o ends, so
// that its keys and its connection do not stay until the agent closes.
func (r *Remote) drop(o *op) {
	a := r.a
	a.post(func() {
		if r.closed.Swap(true) {
			return
		}
		if r.busy > 0 {
			o.after = func() { r.release(a) }
			return
		}
		r.release(a)
	}, false) // false once the agent closed: its teardown releases r
}

// Close destroys the remote region's keys (and closes the connection with
// the last remote region of its agent). It fails with ErrBusy while a
// transfer on it is in flight.
func (r *Remote) Close() error {
	const name = "remote.Remote.Close"
	if !r.ok() {
		return errNil(name, "Remote")
	}
	err := r.a.do(context.Background(), name, func() error {
		if r.closed.Load() {
			return &Error{Op: name, Kind: ErrClosed, Detail: "already closed"}
		}
		if r.busy > 0 {
			return &Error{Op: name, Kind: ErrBusy, Detail: fmt.Sprintf("%d transfers in flight", r.busy)}
		}
		r.closed.Store(true)
		r.release(r.a)
		return nil
	})
	if e, ok := err.(*Error); ok && e.Kind == ErrClosed && !r.closed.Load() {
		r.closed.Store(true)
		return nil // the agent closed: its teardown released everything
	}
	return err
}
