package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CreateTopics creates topics (an existing one is left as it is) and waits
// until every partition of each has a leader.
func (k *ApacheKafka) CreateTopics(ctx context.Context, topics ...TopicSpec) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, tp := range topics {
		cfg := map[string]*string{}
		for key, v := range tp.Configs {
			cfg[key] = kadm.StringPtr(v)
		}
		res, err := adm.CreateTopic(ctx, tp.Partitions, 1, cfg, tp.Name)
		if err == nil {
			err = res.Err
		}
		if err != nil && !strings.Contains(err.Error(), "TOPIC_ALREADY_EXISTS") {
			return fmt.Errorf("create topic %s: %w", tp.Name, err)
		}
	}
	names := make([]string, len(topics))
	for i, tp := range topics {
		names[i] = tp.Name
	}
	for {
		m, err := adm.Metadata(ctx, names...)
		if err == nil && topicsLed(m, topics) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics %v without leaders: %w (metadata: %v)", names, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func topicsLed(m kadm.Metadata, topics []TopicSpec) bool {
	for _, tp := range topics {
		d, ok := m.Topics[tp.Name]
		if !ok || d.Err != nil || int32(len(d.Partitions)) != tp.Partitions {
			return false
		}
		for _, p := range d.Partitions {
			if p.Err != nil || p.Leader < 0 {
				return false
			}
		}
	}
	return true
}

// VerifyTopics checks that each of topics exists on the broker at brokers
// with its partition count and, set on the topic itself, its configs.
func VerifyTopics(ctx context.Context, brokers string, topics []TopicSpec) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx)
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	var errs []error
	for _, want := range topics {
		d, ok := td[want.Name]
		if !ok || int32(len(d.Partitions)) != want.Partitions {
			errs = append(errs, fmt.Errorf("topic %s: exists %v with %d partitions, want %d", want.Name, ok, len(d.Partitions), want.Partitions))
			continue
		}
		rc, err := adm.DescribeTopicConfigs(ctx, want.Name)
		if err != nil {
			return fmt.Errorf("describe %s: %w", want.Name, err)
		}
		c, err := rc.On(want.Name, nil)
		if err != nil {
			return fmt.Errorf("describe %s: %w", want.Name, err)
		}
		for key, v := range want.Configs {
			got := ""
			for _, e := range c.Configs {
				if e.Key == key && e.Source == kmsg.ConfigSourceDynamicTopicConfig {
					got = e.MaybeValue()
				}
			}
			if got != v {
				errs = append(errs, fmt.Errorf("topic %s: %s=%q set on the topic, want %q", want.Name, key, got, v))
			}
		}
	}
	return errors.Join(errs...)
}
