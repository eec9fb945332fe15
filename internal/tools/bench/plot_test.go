package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the report fixtures in testdata")

// fixtureMeta is the provenance of the hand-made fixture reports: an H200
// on a PCIe Gen5 x16 link.
func fixtureMeta(command string) Meta {
	return Meta{Schema: SchemaVersion, Command: command,
		Tool: Tool{Name: "pinmem", Version: "v0.1.0", Revision: "0123456789abcdef", GoVersion: "go1.26.0"},
		Argv: strings.Fields(command), Time: "2026-12-03T08:00:00Z",
		Device: "NVIDIA H200 (device 0, PCI 00000000:1B:00.0)", Driver: "CUDA 13.0",
		Timing: "spin-wait kernel holds the stream while the copies are queued, then events (nvbandwidth's method)",
		Host:   Host{OS: "linux/amd64", CPUModel: "Intel(R) Xeon(R) Platinum 8480+", Cores: 16, MemoryBytes: 128 << 30, Kernel: "6.18.0", NUMANodes: 1},
		Devices: []DeviceInfo{{Ordinal: 0, Name: "NVIDIA H200", PCIBusID: "00000000:1B:00.0", ComputeCapability: "9.0",
			MemoryBytes: 141 << 30, DriverVersion: 13000, PCIeGen: 5, PCIeWidth: 16, PCIeMaxGen: 5, PCIeMaxWidth: 16, PCIeGBps: 63.0}},
	}
}

func res(bench, kind, dir string, size int64, unit Unit, med, spread float64, timing string) Result {
	return Result{Bench: bench, Kind: kind, Dir: dir, Size: size, Unit: unit, Median: med, Min: med * (1 - spread),
		Max: med * (1 + spread), Samples: 5, Verified: true, Timing: timing}
}

// fixtures are hand-made reports of every measurement, in the documented
// schema (docs/results/SCHEMA.md), with H200-like figures.
func fixtures() map[string]Report {
	out := map[string]Report{}
	var bw []Result
	sizes := []int64{64 << 10, 1 << 20, 16 << 20, 256 << 20}
	peak := map[string]float64{KindPageable: 20, KindPinned: 55.3, KindPortable: 55.2, KindWriteCombined: 55.1,
		KindMmapRegister: 55.25, KindGoRegister: 55.15, KindMapped: 50, KindCopier: 25, KindPageableSync: 19}
	for _, k := range AllKinds() {
		for _, d := range AllDirs() {
			for i, n := range sizes {
				v := peak[k] * (0.4 + 0.2*float64(i))
				if d == DirBidir {
					v *= 1.8
				}
				timing := TimingSpin
				switch k {
				case KindPageable:
					timing = TimingEvents
				case KindPageableSync, KindCopier:
					timing = TimingWall
				}
				bw = append(bw, res("bw", k, d, n, GBps, v, 0.01, timing))
			}
		}
	}
	out["bw.json"] = Report{Meta: fixtureMeta("pinmem bench"), Results: bw}
	var pin []Result
	for mi, m := range AllPinMethods() {
		for _, n := range DefaultPinSizes {
			ms := float64(n) / (1 << 30) * 100 * float64(mi+1) / 2
			pin = append(pin, res("pin", m, OpPin, n, Ms, ms+0.05, 0.05, TimingWall), res("pin", m, OpUnpin, n, Ms, ms/4+0.02, 0.05, TimingWall))
			if m == PinGoRegister {
				pin = append(pin, res("pin", m, OpTouch, n, Ms, ms*2, 0.05, TimingWall))
			}
		}
	}
	out["pin.json"] = Report{Meta: fixtureMeta("pinmem bench pin"), Results: pin}
	ov := []Result{
		res("overlap", VariantBound, "pipeline", 512<<20, FPS, 1700, 0, TimingSpin),
		res("overlap", VariantPageableSync, "pipeline", 512<<20, FPS, 420, 0.03, TimingWall),
		res("overlap", VariantPinnedN(1), "pipeline", 512<<20, FPS, 860, 0.02, TimingSpin),
		res("overlap", VariantPinnedN(4), "pipeline", 512<<20, FPS, 1590, 0.02, TimingSpin),
		res("vecadd", "pageable", "e2e", 192<<20, Ms, 14.2, 0.04, TimingWall),
		res("vecadd", "pinned", "e2e", 192<<20, Ms, 3.9, 0.02, TimingWall),
	}
	out["overlap.json"] = Report{Meta: fixtureMeta("pinmem bench overlap"), Results: ov}
	var zc []Result
	for _, r := range []int{1, 2, 4, 8, 16} {
		zc = append(zc, res("zerocopy", VariantZeroCopy, fmt.Sprintf("reuse=%d", r), 256<<20, Ms, 5.2*float64(r), 0.01, TimingSpin),
			res("zerocopy", VariantExplicit, fmt.Sprintf("reuse=%d", r), 256<<20, Ms, 4.9+0.08*float64(r), 0.01, TimingSpin))
	}
	out["zerocopy.json"] = Report{Meta: fixtureMeta("pinmem zerocopy"), Results: zc}
	var mx []Result
	for _, k := range []string{DeviceKind(0), DeviceKind(1), KindAll} {
		for _, d := range AllDirs() {
			v := 55.0
			if k == KindAll {
				v = 108
			}
			if d == DirBidir {
				v *= 1.8
			}
			mx = append(mx, res("matrix", k, d, 256<<20, GBps, v, 0.01, TimingSpin))
		}
	}
	mm := fixtureMeta("pinmem bench matrix")
	mm.Devices = append(mm.Devices, mm.Devices[0])
	mm.Devices[1].Ordinal = 1
	out["matrix.json"] = Report{Meta: mm, Results: mx}
	// A session without spin-wait: the note must appear.
	ev := fixtureMeta("pinmem bench")
	ev.Timing = "plain events, launch overhead may be included (kernels unavailable)"
	var evs []Result
	for _, n := range sizes {
		evs = append(evs, res("bw", KindPinned, DirH2D, n, GBps, 40, 0.05, TimingEvents))
	}
	out["bw-events.json"] = Report{Meta: ev, Results: evs}
	return out
}

// TestFixtures keeps testdata in step with fixtures (go test -run
// TestFixtures -update rewrites it) and checks each file reads back.
func TestFixtures(t *testing.T) {
	for name, rep := range fixtures() {
		path := filepath.Join("testdata", name)
		if *update {
			var b bytes.Buffer
			if err := WriteJSON(&b, rep.Meta, rep.Results); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadReport(f)
		_ = f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got.Results) != len(rep.Results) || got.Meta.Command != rep.Meta.Command || got.Meta.Devices[0].PCIeGBps != 63 {
			t.Errorf("%s: read back %d results, meta %+v", name, len(got.Results), got.Meta)
		}
	}
}

// CheckImage checks that data is a valid image of format f: a PNG that
// decodes with at least minW x minH pixels, or well-formed SVG with an svg
// root and at least minW x minH points. It returns the size.
func CheckImage(data []byte, f ImageFormat, minW, minH int) (w, h int, err error) {
	switch f {
	case ImagePNG:
		img, err := png.Decode(bytes.NewReader(data))
		if err != nil {
			return 0, 0, fmt.Errorf("not a PNG: %w", err)
		}
		b := img.Bounds()
		w, h = b.Dx(), b.Dy()
	case ImageSVG:
		dec := xml.NewDecoder(bytes.NewReader(data))
		root := true
		for {
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return 0, 0, fmt.Errorf("SVG is not well-formed XML: %w", err)
			}
			if se, ok := tok.(xml.StartElement); ok && root {
				root = false
				if se.Name.Local != "svg" {
					return 0, 0, fmt.Errorf("root element %q, want svg", se.Name.Local)
				}
				for _, a := range se.Attr {
					v, _ := strconv.ParseFloat(strings.TrimRight(a.Value, "ptx"), 64)
					switch a.Name.Local {
					case "width":
						w = int(v)
					case "height":
						h = int(v)
					}
				}
			}
		}
		if root {
			return 0, 0, errors.New("no SVG element")
		}
	}
	if w < minW || h < minH || w > 20000 || h > 20000 {
		return w, h, fmt.Errorf("size %dx%d, want at least %dx%d and at most 20000x20000", w, h, minW, minH)
	}
	return w, h, nil
}

// TestWritePlotEveryMeasurement renders every fixture as PNG and SVG and
// checks each is a valid image whose height grows with its panels.
func TestWritePlotEveryMeasurement(t *testing.T) {
	panels := map[string]int{"bw.json": 3, "pin.json": 3, "overlap.json": 2, "zerocopy.json": 1, "matrix.json": 1, "bw-events.json": 1}
	for name, want := range panels {
		f, err := os.Open(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := ReadReport(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ps, err := buildPanels(rep.Meta, rep.Results)
		if err != nil || len(ps) != want {
			t.Fatalf("%s: %d panels, %v; want %d", name, len(ps), err, want)
		}
		for _, format := range []ImageFormat{ImagePNG, ImageSVG} {
			var b bytes.Buffer
			if err := WritePlot(&b, format, rep.Meta, rep.Results); err != nil {
				t.Fatalf("%s %s: %v", name, format, err)
			}
			minW, minH := 900, 400*want
			if format == ImageSVG {
				minW, minH = 600, 280*want // points
			}
			if _, _, err := CheckImage(b.Bytes(), format, minW, minH); err != nil {
				t.Errorf("%s %s: %v", name, format, err)
			}
			if format == ImageSVG {
				svg := b.String()
				for _, s := range wantText(name) {
					if !strings.Contains(svg, s) {
						t.Errorf("%s: SVG lacks %q", name, s)
					}
				}
			}
		}
	}
}

// wantText is text each fixture's plot must show: axis units, the PCIe
// limit where the link is known, the fallback note.
func wantText(name string) []string {
	switch name {
	case "bw.json":
		return []string{"GB/s", "log scale", "PCIe Gen5 x16 limit (63.00 GB/s)", "PCIe Gen5 x16 limit (126.0 GB/s)", "host to device", "mmap-register", "256MiB"}
	case "pin.json":
		return []string{"ms (log scale", "mmap-register", "malloc+register", "4GiB"}
	case "overlap.json":
		return []string{"FPS", "pinned-4streams", "vector add"}
	case "zerocopy.json":
		return []string{"reuse factor", "zero-copy", "explicit"}
	case "matrix.json":
		return []string{"gpu1 bidir", "all h2d"}
	case "bw-events.json":
		return []string{"plain events"}
	}
	return nil
}

func TestWritePlotNothing(t *testing.T) {
	var b bytes.Buffer
	err := WritePlot(&b, ImagePNG, Meta{}, []Result{skipped("bw", KindPinned, DirH2D, 1, GBps, "x")})
	if !errors.Is(err, ErrInvalid) || b.Len() != 0 {
		t.Errorf("WritePlot of skipped results: %v, %d bytes", err, b.Len())
	}
	if err := WritePlot(&b, "gif", Meta{}, sampleResults()); !errors.Is(err, ErrInvalid) {
		t.Errorf("WritePlot gif: %v", err)
	}
	if _, err := ImageFormatOf("x.jpeg"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ImageFormatOf(x.jpeg): %v", err)
	}
}
