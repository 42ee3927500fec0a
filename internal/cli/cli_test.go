package cli_test

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/internal/cli"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"0", 0, false},
		{"134217728", 128 << 20, false},
		{"128MiB", 128 << 20, false},
		{"64 KiB", 64 << 10, false},
		{"1GiB", 1 << 30, false},
		{"10B", 10, false},
		{"2mb", 2 << 20, false},
		{"2TiB", 2 << 40, false},
		{"1t", 1 << 40, false},
		{"1.5GiB", 3 << 29, false},
		{"1.5MiB", 3 << 19, false},
		{".5 KiB", 512, false},
		{"0.1KiB", 102, false}, // rounded down to whole bytes
		{"1.5", 0, true},       // plain bytes are whole
		{"1.5B", 0, true},
		{"1e3MiB", 0, true},
		{"-1.5MiB", 0, true},
		{"1..5MiB", 0, true},
		{".MiB", 0, true},
		{"NaNMiB", 0, true},
		{"9000000TiB", 0, true},
		{"8388608.5TiB", 0, true},
		{"-1", 0, true},
		{"MiB", 0, true},
		{"", 0, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := cli.ParseSize(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d, err=%v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestSizeString(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 1000: "1000", 64 << 10: "64KiB", 3 << 29: "1536MiB", 2 << 40: "2TiB"} {
		s := cli.Size(in)
		if got := s.String(); got != want {
			t.Errorf("Size(%d).String() = %q, want %q", in, got, want)
		}
	}
}

func TestParseEnv(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	size := cli.Size(1 << 20)
	fs.Var(&size, "flush-size", "")
	group := fs.String("group", "flowlog", "")
	t.Setenv("FLOWLOG_FLUSH_SIZE", "2MiB")
	t.Setenv("FLOWLOG_GROUP", "from-env")
	if err := cli.Parse(fs, []string{"--group", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if size != 2<<20 || *group != "from-flag" {
		t.Fatalf("flush-size=%d group=%q; want %d and the command line's value", size, *group, 2<<20)
	}
	t.Setenv("FLOWLOG_FLUSH_SIZE", "lots")
	fs2 := flag.NewFlagSet("y", flag.ContinueOnError)
	fs2.Var(&size, "flush-size", "")
	if err := cli.Parse(fs2, nil); err == nil {
		t.Fatal("bad size in the environment was accepted")
	}
}

func TestParseQuietAndSources(t *testing.T) {
	newFS := func() (*flag.FlagSet, *strings.Builder) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		var out strings.Builder
		fs.SetOutput(&out)
		fs.String("log-format", "json", "")
		fs.String("redis-prefix", "flowlog", "")
		fs.String("group", "g", "")
		return fs, &out
	}
	t.Run("typo", func(t *testing.T) {
		fs, out := newFS()
		err := cli.Parse(fs, []string{"--grop", "x"})
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "-grop") || out.Len() != 0 {
			t.Fatalf("Parse = %v (%T), printed %q; want a UsageError and nothing printed", err, err, out.String())
		}
	})
	t.Run("help", func(t *testing.T) {
		fs, out := newFS()
		if err := cli.Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-redis-prefix") {
			t.Fatalf("Parse(-h) = %v, printed %q; want ErrHelp and the flags once", err, out.String())
		}
		if n := strings.Count(out.String(), "-redis-prefix"); n != 1 {
			t.Errorf("help printed %d times", n)
		}
	})
	t.Run("annotate", func(t *testing.T) {
		fs, _ := newFS()
		t.Setenv("FLOWLOG_LOG_FORMAT", "xml")
		t.Setenv("FLOWLOG_REDIS_PREFIX", "a b")
		t.Setenv("FLOWLOG_GROUP", "from-env")
		src, err := cli.ParseSources(fs, []string{"--group", "cmdline"})
		if err != nil {
			t.Fatal(err)
		}
		base := errors.New("--log-format: \"xml\" is neither json nor text\nredis-prefix \"a b\": bad\n--group: bad\nother problem")
		got := src.Annotate(base)
		want := "--log-format: \"xml\" is neither json nor text (from FLOWLOG_LOG_FORMAT)\nredis-prefix \"a b\": bad (from FLOWLOG_REDIS_PREFIX)\n--group: bad\nother problem"
		if got.Error() != want || !errors.Is(got, base) {
			t.Errorf("Annotate =\n%s\nwant\n%s", got, want)
		}
		if src.Annotate(nil) != nil {
			t.Error("Annotate(nil) != nil")
		}
	})
}
