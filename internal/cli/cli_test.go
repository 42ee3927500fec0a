package cli_test

import (
	"flag"
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
		{"-1", 0, true},
		{"1.5MiB", 0, true},
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
