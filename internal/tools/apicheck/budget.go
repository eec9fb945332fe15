package apicheck

import (
	"bufio"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Count is how many exported identifiers of each kind a package has.
type Count struct {
	NonConst   int // functions, methods, types and variables: what the budget limits
	Const      int // pinmem's own constants
	TableConst int // constants transcribing CUDA's or safetensors' tables
	Member     int // struct fields and interface methods (listed, not counted)
}

// Counts counts lines by package.
func Counts(lines []Line) map[string]Count {
	m := map[string]Count{}
	for _, l := range lines {
		c := m[l.Pkg]
		switch l.Kind {
		case NonConst:
			c.NonConst++
		case Const:
			c.Const++
		case TableConst:
			c.TableConst++
		case Member:
			c.Member++
		}
		m[l.Pkg] = c
	}
	return m
}

// Budget is the budget file: the most non-constant identifiers each public
// package may export, and the types whose constants are TableConst. Its
// lines are
//
//	# a comment (kept when the file is rewritten)
//	budget PKG N     (PKG as the API file writes it: pinmem, pinmem/cuda, ...)
//	table PKG.Type   (the constants of PKG.Type transcribe a table)
type Budget struct {
	Comments []string
	Max      map[string]int
	Tables   map[string]bool
}

// ParseBudget reads a budget file.
func ParseBudget(text string) (Budget, error) {
	b := Budget{Max: map[string]int{}, Tables: map[string]bool{}}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		f := strings.Fields(line)
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			b.Comments = append(b.Comments, line)
		case len(f) == 3 && f[0] == "budget":
			v, err := strconv.Atoi(f[2])
			if err != nil || v < 0 {
				return Budget{}, fmt.Errorf("budget file, line %d: %q: want a count of at least 0", n, f[2])
			}
			if _, dup := b.Max[f[1]]; dup {
				return Budget{}, fmt.Errorf("budget file, line %d: a second budget for %s", n, f[1])
			}
			b.Max[f[1]] = v
		case len(f) == 2 && f[0] == "table" && strings.Contains(f[1], "."):
			b.Tables[f[1]] = true
		default:
			return Budget{}, fmt.Errorf("budget file, line %d: %q: want \"budget PKG N\", \"table PKG.Type\" or a # comment", n, line)
		}
	}
	return b, sc.Err()
}

// Format writes the budget file: comments, budgets by package, tables.
func (b Budget) Format() string {
	var s strings.Builder
	for _, c := range b.Comments {
		s.WriteString(c + "\n")
	}
	for _, p := range slices.Sorted(maps.Keys(b.Max)) {
		fmt.Fprintf(&s, "budget %s %d\n", p, b.Max[p])
	}
	for _, t := range slices.Sorted(maps.Keys(b.Tables)) {
		fmt.Fprintf(&s, "table %s\n", t)
	}
	return s.String()
}

// Check returns one problem per package that exports more non-constant
// identifiers than its budget or has no budget, and per table type that
// names no constant (a stale line).
func (b Budget) Check(lines []Line) []string {
	var problems []string
	counts := Counts(lines)
	for _, p := range slices.Sorted(maps.Keys(counts)) {
		c := counts[p]
		limit, ok := b.Max[p]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s exports %d non-constant identifiers and has no budget", p, c.NonConst))
		case c.NonConst > limit:
			problems = append(problems, fmt.Sprintf("%s exports %d non-constant identifiers, %d over its budget of %d", p, c.NonConst, c.NonConst-limit, limit))
		}
	}
	used := map[string]bool{}
	for _, l := range lines {
		used[l.ConstType] = true
	}
	for _, t := range slices.Sorted(maps.Keys(b.Tables)) {
		if !used[t] {
			problems = append(problems, fmt.Sprintf("table %s: no exported constant has this type", t))
		}
	}
	return problems
}

// Lower returns b with each package's budget lowered to what it exports
// now, a budget for each new package at what it exports, and the budgets of
// packages that are gone dropped. It never raises a budget: a package that
// grows past its budget needs a decision, written by hand.
func (b Budget) Lower(lines []Line) Budget {
	out := Budget{Comments: b.Comments, Max: map[string]int{}, Tables: b.Tables}
	for p, c := range Counts(lines) {
		limit, ok := b.Max[p]
		if !ok || c.NonConst < limit {
			limit = c.NonConst
		}
		out.Max[p] = limit
	}
	return out
}

// Diff returns the lines of want missing from got ("- line", removed from
// the surface) and the lines of got missing from want ("+ line", added),
// sorted.
func Diff(file, surface []string) []string {
	in := func(s []string) map[string]bool {
		m := make(map[string]bool, len(s))
		for _, x := range s {
			m[x] = true
		}
		return m
	}
	inFile, inSurface := in(file), in(surface)
	var d []string
	for _, l := range file {
		if !inSurface[l] {
			d = append(d, "- "+l)
		}
	}
	for _, l := range surface {
		if !inFile[l] {
			d = append(d, "+ "+l)
		}
	}
	slices.SortStableFunc(d, func(a, b string) int { return strings.Compare(a[2:], b[2:]) })
	return d
}
