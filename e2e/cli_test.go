package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// cliRun runs a built binary with args (and extra environment) to
// completion and returns its exit code, stdout and stderr.
func cliRun(t testing.TB, bin string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("%s %v: %v", bin, args, err)
	return 0, "", ""
}

// commandLineRE is a command in the list `<binary> help` prints.
var commandLineRE = regexp.MustCompile(`(?m)^  ([a-z]+) +\S`)

// listedCommands are the commands `<bin> help` lists.
func listedCommands(t *testing.T, name string) []string {
	t.Helper()
	code, out, stderr := cliRun(t, binary(t, name), nil, "help")
	if code != 0 || stderr != "" || !strings.Contains(out, "FLOWLOG_") {
		t.Fatalf("%s help: exit %d, stdout:\n%s\nstderr:\n%s\nwant the commands and the FLOWLOG_* variables on stdout", name, code, out, stderr)
	}
	_, list, _ := strings.Cut(out, "commands:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var cmds []string
	for _, m := range commandLineRE.FindAllStringSubmatch(list, -1) {
		cmds = append(cmds, m[1])
	}
	return cmds
}

// flagLineRE is a flag in a command's help: "  --name[ type]".
var flagLineRE = regexp.MustCompile(`^  --([a-z0-9-]+)( [a-z]+)?$`)

// TestHelpEveryCommand walks every command both binaries list and checks
// one help style: -h exits 0 and writes to stdout alone (so that `consumer
// restore -h | less` shows it) the usage line, the exit codes and the
// command's flags in titled groups, each flag with its FLOWLOG_* variable;
// the operator commands that never talk to Kafka list no Kafka flag; a flag
// the command does not have is a usage error, exit 2. New commands are
// walked as soon as `help` lists them.
func TestHelpEveryCommand(t *testing.T) {
	noKafka := map[string]bool{"restore": true, "verify": true, "snapshot": true, "flows": true, "truncate": true, "gc": true}
	walked := 0
	for _, name := range []string{"consumer", "producer"} {
		cmds := listedCommands(t, name)
		if len(cmds) < 4 {
			t.Fatalf("%s help lists %v", name, cmds)
		}
		for _, cmd := range cmds {
			t.Run(name+" "+cmd, func(t *testing.T) {
				code, out, stderr := cliRun(t, binary(t, name), nil, cmd, "-h")
				if code != 0 || stderr != "" || !strings.HasPrefix(out, "usage: "+name+" "+cmd) {
					t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant exit 0 and the help on stdout alone", code, stderr, out)
				}
				if !strings.Contains(out, "FLOWLOG_") || !strings.Contains(out, "Exit codes: 0 done, 1 failed, 2 bad command line") {
					t.Errorf("help names neither the FLOWLOG_* variables nor the exit codes:\n%s", out)
				}
				lines := strings.Split(out, "\n")
				flags, section := 0, ""
				for i, line := range lines {
					if strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " ") && i > 0 && lines[i-1] == "" {
						section = line
					}
					m := flagLineRE.FindStringSubmatch(line)
					if m == nil {
						continue
					}
					flags++
					if section == "" {
						t.Errorf("--%s is listed outside a titled group", m[1])
					}
					env := "FLOWLOG_" + strings.ToUpper(strings.ReplaceAll(m[1], "-", "_"))
					if i+1 >= len(lines) || !strings.Contains(lines[i+1], "env "+env+")") {
						t.Errorf("--%s does not name its variable %s", m[1], env)
					}
					if name == "consumer" && noKafka[cmd] && (m[1] == "brokers" || strings.HasPrefix(m[1], "kafka-") || strings.HasSuffix(m[1], "-topic")) {
						t.Errorf("%s never talks to Kafka but lists --%s", cmd, m[1])
					}
				}
				if cmd != "version" && flags == 0 {
					t.Errorf("no flag listed:\n%s", out)
				}
				if code, _, stderr := cliRun(t, binary(t, name), nil, cmd, "--no-such-flag"); code != 2 || !strings.Contains(stderr, "-h' for help") {
					t.Errorf("an unknown flag: exit %d, stderr %q; want exit 2 and a pointer to -h", code, stderr)
				}
			})
			walked++
		}
	}
	t.Logf("walked the help of %d commands", walked)

	// Common usage errors (a typo in an operation, a bad value, a flag the command lacks), all exit 2.
	for _, tc := range []struct {
		bin  string
		args []string
	}{
		{"producer", []string{"flow", "craete", "--name", "f"}},
		{"producer", []string{"load", "--events", "-1"}},
		{"consumer", []string{"restore", "--brokers", "127.0.0.1:9092", "--flow", "f", "--out", "x"}},
		{"consumer", []string{"run", "--flush-size", "1"}},
		{"consumer", []string{"gc", "--grace", "-1h"}},
		{"consumer", []string{"craete"}},
	} {
		if code, _, stderr := cliRun(t, binary(t, tc.bin), nil, tc.args...); code != 2 {
			t.Errorf("%s %v: exit %d, want 2; stderr:\n%s", tc.bin, tc.args, code, stderr)
		}
	}
}

// TestVersion: both binaries print their build for --version and version,
// with the module version and the VCS revision the toolchain stamped in.
func TestVersion(t *testing.T) {
	for _, name := range []string{"consumer", "producer"} {
		for _, args := range [][]string{{"--version"}, {"version"}} {
			code, out, stderr := cliRun(t, binary(t, name), nil, args...)
			if code != 0 || stderr != "" || !regexp.MustCompile(`^`+name+` \S+ \(revision \S+.*, go1\.[0-9.]+.*\)\n$`).MatchString(out) {
				t.Errorf("%s %v: exit %d, stdout %q, stderr %q", name, args, code, out, stderr)
			}
		}
	}
	code, out, _ := cliRun(t, binary(t, "consumer"), nil, "version", "--json")
	if code != 0 || !strings.Contains(out, `"version":`) || !strings.Contains(out, `"revision":`) || !strings.Contains(out, `"go_version":`) {
		t.Errorf("consumer version --json: exit %d:\n%s", code, out)
	}
}
