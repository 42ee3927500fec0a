package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/rebuild"
)

// recoverConfig is everything `consumer recover` takes.
type recoverConfig struct {
	conn       connConfig
	DryRun     bool
	Replace    bool
	Incomplete bool
	Parallel   int
}

func (c *recoverConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.uses = useKafka // the group's committed offsets
	c.conn.RegisterFlags(f)
	f.BoolVar(&c.DryRun, "dry-run", false, "print the plan, write nothing")
	f.BoolVar(&c.Replace, "replace-existing", false, "delete every key under --redis-prefix before writing (recover refuses a prefix that holds keys without it)")
	f.BoolVar(&c.Incomplete, "allow-incomplete", false, "write the plan even when metas hold chunks of flow ids no catalog describes (those flows stay unrestorable)")
	f.IntVar(&c.Parallel, "parallel", 4, "metas read at once")
}

// runRecover rebuilds the Redis state under --redis-prefix from the
// bucket and the group's Kafka offsets (docs/OPERATING.md, "Losing
// Redis"): it prints the plan, and unless --dry-run writes it in one
// MULTI whose last key is the owner.
func runRecover(ctx context.Context, args []string) error {
	fs := newFlagSet("recover")
	var cfg recoverConfig
	cfg.RegisterFlags(fs)
	st, closeStore, err := cfg.conn.parseOpen(fs, args)
	if err != nil {
		return err
	}
	defer closeStore()
	n, some, err := st.PrefixKeys(ctx, 5)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if n > 0 && !cfg.Replace && !cfg.DryRun {
		return fmt.Errorf("redis holds keys under --redis-prefix %q (%v...): recover writes only into an empty prefix; "+
			"check that no consumer runs there, then give --replace-existing to delete them first", cfg.conn.Redis.Prefix, some)
	}
	b, err := cfg.conn.openBucket(ctx, false)
	if err != nil {
		return err
	}
	defer b.Close()
	in := rebuild.Input{Bucket: b, Prefix: cfg.conn.GCS.Prefix, Group: cfg.conn.Group, ApplyTopic: cfg.conn.Kafka.ApplyTopic,
		DDLTopic: cfg.conn.Kafka.DDLTopic, Now: time.Now(), Parallel: cfg.Parallel}
	if err := kafkaOffsets(ctx, cfg.conn, &in); err != nil {
		return err
	}
	plan, err := rebuild.Build(ctx, in)
	if err != nil {
		return err
	}
	plan.Print(os.Stdout)
	if cfg.DryRun {
		fmt.Println("dry run: nothing written")
		return nil
	}
	if len(plan.Uncatalog) > 0 && !cfg.Incomplete {
		return fmt.Errorf("flow ids %v have chunks in the bucket but no catalog (a layout v1 backup from before catalogs, or a flow created after its last catalog): "+
			"their definitions and windows exist nowhere else; write the rest anyway with --allow-incomplete, and create those flows again", plan.Uncatalog)
	}
	if n > 0 {
		deleted, err := st.DeletePrefix(ctx)
		if err != nil {
			return fmt.Errorf("redis: delete the keys under --redis-prefix %q: %w", cfg.conn.Redis.Prefix, err)
		}
		fmt.Printf("deleted %d keys under --redis-prefix %q\n", deleted, cfg.conn.Redis.Prefix)
	}
	if err := plan.Apply(ctx, st); err != nil {
		if errors.Is(err, meta.ErrNotEmpty) {
			return fmt.Errorf("%w: a consumer or another recover claimed --redis-prefix %q meanwhile", err, cfg.conn.Redis.Prefix)
		}
		return err
	}
	fmt.Printf("recovered: Redis under --redis-prefix %q now holds the plan above; start the consumers\n", cfg.conn.Redis.Prefix)
	return nil
}

// kafkaOffsets fills in the apply topic's partitions, the group's
// committed offsets of them, and the DDL topic's end offsets.
func kafkaOffsets(ctx context.Context, c connConfig, in *rebuild.Input) error {
	opts, err := c.Kafka.Opts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, c.Kafka.ApplyTopic, c.Kafka.DDLTopic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("kafka: list end offsets of %s and %s: %w", c.Kafka.ApplyTopic, c.Kafka.DDLTopic, err)
	}
	in.DDLEnds = map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		switch o.Topic {
		case c.Kafka.ApplyTopic:
			in.ApplyPartitions = append(in.ApplyPartitions, o.Partition)
		case c.Kafka.DDLTopic:
			in.DDLEnds[o.Partition] = o.Offset
		}
	})
	committed, err := adm.FetchOffsetsForTopics(ctx, c.Group, c.Kafka.ApplyTopic)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return fmt.Errorf("kafka: committed offsets of group %s: %w", c.Group, err)
	}
	in.Committed = map[int32]int64{}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.Topic == c.Kafka.ApplyTopic && o.At >= 0 {
			in.Committed[o.Partition] = o.At
		}
	})
	return nil
}
