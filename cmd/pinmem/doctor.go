package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/cmd/pinmem/internal/diag"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/bench"
)

// doctorSchemaVersion is the version of doctor's JSON
// (docs/results/doctor.schema.json).
const doctorSchemaVersion = 1

// writeDoctorJSON writes the doctor's report as JSON, led by the schema
// version and the build that wrote it.
func writeDoctorJSON(w io.Writer, r *diag.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Schema int        `json:"schema_version"`
		Tool   bench.Tool `json:"tool"`
		*diag.Report
	}{doctorSchemaVersion, toolInfo(), r})
}

func newDoctor() *cobra.Command {
	var (
		o      output
		strict bool
	)
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Report the NVIDIA driver, each GPU and the host facts that matter for pinned memory",
		Long: `doctor prints what pinmem can see: whether the NVIDIA driver was found (and why
not), its version, each GPU with the attributes that matter for host memory,
the host's memory, huge pages and NUMA layout. Then a verdict per check (ok,
warning or problem, each with one line of advice), the pinned-memory budget in
force and where it comes from, and which pinmem commands will work here.

doctor exits 0 whenever it could report, also on a machine with no GPU; with
--strict it exits 3 without an NVIDIA driver or a GPU, as every command that
needs one does, and 1 when a check found another problem. Its JSON carries the schema
version and the build (docs/results/doctor.schema.json).

` + exitHelp,
		Example: `  pinmem doctor
  pinmem doctor --format json -o doctor.json
  pinmem doctor --strict && pinmem bench`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := o.check()
			if err != nil {
				return err
			}
			r := diag.Collect()
			var buf bytes.Buffer
			if f == "json" {
				err = writeDoctorJSON(&buf, r)
			} else {
				err = r.WriteText(&buf)
			}
			if err != nil {
				return err
			}
			if err := o.write(cmd, buf.Bytes()); err != nil {
				return err
			}
			switch n := r.Problems(); {
			case strict && !r.DriverFound:
				// As every command that needs a GPU: exit status 3.
				return fmt.Errorf("doctor --strict: %w", cuda.ErrNoDriver)
			case strict && len(r.Devices) == 0:
				return fmt.Errorf("doctor --strict: %w", cuda.ErrNoDevice)
			case strict && n > 0:
				return &problemError{fmt.Sprintf("doctor --strict: %d check(s) found a problem", n)}
			}
			return nil
		},
	}
	o.register(c, []string{"table", "json"}, false)
	c.Flags().BoolVar(&strict, "strict", false, "exit 3 without a driver or GPU, 1 when a check finds another problem")
	return c
}
