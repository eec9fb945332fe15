package main

import (
	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/internal/diag"
)

func newDoctor() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Report the NVIDIA driver, each GPU and the host facts that matter for pinned memory",
		Long: `doctor prints what pinmem can see: whether the NVIDIA driver was found (and why
not), its version, and each GPU with the attributes that matter for host memory.
It exits 0 on a machine with no GPU, saying that no driver was found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := diag.Collect()
			if asJSON {
				return r.WriteJSON(cmd.OutOrStdout())
			}
			return r.WriteText(cmd.OutOrStdout())
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of text")
	return c
}
