// Command benchtable reads `go test -bench` output and prints one table
// (make bench prints benchstat's medians first; this adds what benchstat
// cannot show, the ratio of each row to its own baseline):
// for every benchmark whose last name element is impl=NAME, the median of
// impl=branch (branchbox) beside the median of each other impl (the
// baselines measured in the same run), and their ratio.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// A result line: name, iterations, then value/unit pairs.
var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

type key struct{ bench, impl, unit string }

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	samples, order, err := parse(in)
	if err != nil {
		return err
	}
	if len(order) == 0 {
		return fmt.Errorf("no impl=NAME benchmark results in the input")
	}
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "benchmark\tmetric\tbranch (median)\tbaseline\tbaseline (median)\tratio branch/baseline\truns\t")
	for _, k := range order {
		ours, ok := samples[key{k.bench, "branch", k.unit}]
		if !ok {
			continue
		}
		var baselines []string
		for kk := range samples {
			if kk.bench == k.bench && kk.unit == k.unit && kk.impl != "branch" {
				baselines = append(baselines, kk.impl)
			}
		}
		sort.Strings(baselines)
		if len(baselines) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t%d\t\n", k.bench, k.unit, format(median(ours), k.unit), len(ours))
		}
		for _, b := range baselines {
			theirs := samples[key{k.bench, b, k.unit}]
			m, bm := median(ours), median(theirs)
			ratio := "-"
			if bm != 0 {
				// Three significant digits: a fork 1/10,000 of a copy
				// must not print as 0.00x.
				ratio = fmt.Sprintf("%.3gx", m/bm)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t\n", k.bench, k.unit, format(m, k.unit), b, format(bm, k.unit), ratio, len(ours), len(theirs))
		}
	}
	return tw.Flush()
}

// parse collects every sample per (benchmark, impl, unit), and the order in
// which branch results first appeared.
func parse(in io.Reader) (map[key][]float64, []key, error) {
	samples := map[key][]float64{}
	var order []key
	seen := map[key]bool{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		m := line.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		name := m[1]
		i := strings.LastIndex(name, "/impl=")
		if i < 0 {
			continue
		}
		bench, impl := name[:i], name[i+len("/impl="):]
		fields := strings.Fields(m[2])
		for j := 0; j+1 < len(fields); j += 2 {
			v, err := strconv.ParseFloat(fields[j], 64)
			if err != nil {
				continue
			}
			k := key{bench, impl, fields[j+1]}
			samples[k] = append(samples[k], v)
			if first := (key{bench: bench, unit: fields[j+1]}); !seen[first] {
				seen[first] = true
				order = append(order, first)
			}
		}
	}
	return samples, order, sc.Err()
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func format(v float64, unit string) string {
	if strings.HasPrefix(unit, "ns/") {
		return time.Duration(v).Round(time.Microsecond / 10).String()
	}
	// Four significant digits (whole numbers from 1000): a median of
	// float samples prints as 273.4, not 273.41999999999996.
	if v >= 1000 || v <= -1000 {
		return strconv.FormatFloat(v, 'f', 0, 64) + " " + unit
	}
	return strconv.FormatFloat(v, 'g', 4, 64) + " " + unit
}
