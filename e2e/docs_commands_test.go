package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// docCommand is one command line the docs show: where, and its arguments
// after the binary's name.
type docCommand struct {
	where string // file:line
	bin   string // consumer or producer
	args  []string
}

// inlineCommandRE is an inline code span that starts with a binary's name.
var inlineCommandRE = regexp.MustCompile("`(?:\\./|/)?(consumer|producer) ([^`]+)`")

// docPlaceholders are the placeholders the docs' synopses use for a flag's
// value or help's command, and a value that stands for them.
var docPlaceholders = map[string]string{"F": "demo", "TS": "-1h", "T": "-1h", "A": "-2h", "DIR": "restored", "C": "restore",
	"B": "localhost:9092", "K": "7480000000000000015f72"}

// docCommands returns every command line of the binaries in README.md and
// docs/*.md: the lines of code blocks (indented or fenced; a trailing `\`
// joins the next line; a `#` comment, a pipe or a redirection ends it) and
// inline code spans, with `go run ./cmd/X`, `./X` and `/X` read as X. A
// synopsis's optional parts ([--dry-run]) count as written, its placeholders
// get a value of their type. Lines whose word after the binary is neither a
// flag nor a command in list are prose or output and are left out, as are
// lines with "<...>" or "..." placeholders.
func docCommands(t *testing.T, list map[string][]string) []docCommand {
	t.Helper()
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []docCommand
	add := func(where, bin, rest string) {
		for _, end := range []string{" #", " |", " >", " 2>"} {
			rest, _, _ = strings.Cut(rest, end)
		}
		if strings.Contains(rest, "...") || strings.ContainsAny(rest, "<>$") {
			return
		}
		args := strings.Fields(strings.NewReplacer("[", "", "]", "").Replace(rest))
		if len(args) == 0 || !strings.HasPrefix(args[0], "-") && !slices.Contains(list[bin], args[0]) && args[0] != "help" {
			return
		}
		for i := 1; i < len(args); i++ {
			if v, ok := docPlaceholders[args[i]]; ok && (strings.HasPrefix(args[i-1], "--") || args[i-1] == "help") {
				args[i] = v
			}
		}
		out = append(out, docCommand{where: where, bin: bin, args: args})
	}
	lineRE := regexp.MustCompile(`^(?:\$ )?(?:go run \./cmd/|\./|/)?(consumer|producer) (.*)$`)
	for _, file := range append([]string{"../README.md"}, files...) {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		fenced := false
		for i := 0; i < len(lines); i++ {
			l := lines[i]
			where := strings.TrimPrefix(file, "../") + ":" + strconv.Itoa(i+1)
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				fenced = !fenced
				continue
			}
			if fenced || strings.HasPrefix(l, "    ") {
				code := strings.TrimSpace(l)
				for strings.HasSuffix(code, `\`) && i+1 < len(lines) {
					i++
					code = strings.TrimSuffix(code, `\`) + " " + strings.TrimSpace(lines[i])
				}
				if m := lineRE.FindStringSubmatch(code); m != nil {
					add(where, m[1], m[2])
				}
				continue
			}
			for _, m := range inlineCommandRE.FindAllStringSubmatch(l, -1) {
				add(where, m[1], m[2])
			}
		}
	}
	return out
}

// TestDocsCommandLines checks every command line of the README and docs/
// against the built binaries: the command exists and takes every flag the
// line gives, with a value its flag accepts. Each line runs with -h added
// at its end, so that it parses all of it and stops before it connects
// to anything; a line that asks for help already runs as written. A flag
// renamed or removed, a command that is gone, a value that no longer
// parses: the test names the file and line.
func TestDocsCommandLines(t *testing.T) {
	list := map[string][]string{"consumer": listedCommands(t, "consumer"), "producer": listedCommands(t, "producer")}
	cmds := docCommands(t, list)
	seen := map[string]bool{}
	for _, c := range cmds {
		args := c.args
		if !slices.ContainsFunc(args, isHelpArg) && args[0] != "help" {
			args = append(slices.Clone(args), "-h")
		}
		line := c.bin + " " + strings.Join(c.args, " ")
		if seen[line] {
			continue
		}
		seen[line] = true
		t.Logf("%s: %s", c.where, line)
		code, out, stderr := cliRun(t, binary(t, c.bin), nil, args...)
		if code != 0 || !strings.HasPrefix(out, "usage: "+c.bin) {
			t.Errorf("%s: %q: exit %d, stderr:\n%s", c.where, line, code, stderr)
		}
	}
	// The docs show at least these; fewer means the extraction broke.
	for _, want := range []string{"consumer dev", "consumer restore --flow demo --out ./restore", "producer load --events 20000",
		"consumer truncate --flow demo --until -1h --dry-run", "consumer gc --grace 1h --dry-run", "producer flow create --name orders"} {
		if !slices.ContainsFunc(cmds, func(c docCommand) bool { return strings.HasPrefix(c.bin+" "+strings.Join(c.args, " "), want) }) {
			t.Errorf("no command line %q found in the docs", want)
		}
	}
	t.Logf("checked %d distinct command lines of the docs", len(seen))
}

func isHelpArg(a string) bool { return a == "-h" || a == "-help" || a == "--help" }
