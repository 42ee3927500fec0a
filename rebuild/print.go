package rebuild

import (
	"fmt"
	"io"
	"time"

	"github.com/flowlog/flowlog/event"
)

// Print writes the plan for the operator: what each key family will hold
// and why, every meta left out or kept with duplicates, and the
// duplicates and gaps the choice could not avoid.
func (p *Plan) Print(w io.Writer) {
	pf := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	pf("recovery plan for consumer group %q", p.Group)
	switch {
	case p.CheckpointPath != "":
		pf("checkpoint: %d (%s) from %s", p.Checkpoint, tsTime(p.Checkpoint), p.CheckpointPath)
	case len(p.FlowCheckpoints) > 0:
		pf("checkpoint: no global checkpoint object; %d flows take their layout v1 checkpoint object", len(p.FlowCheckpoints))
	default:
		pf("checkpoint: none in the bucket: flows keep the checkpoint their catalog was written at")
	}
	if p.OtherGroups > 0 {
		pf("ignored: %d catalogs of other consumer groups", p.OtherGroups)
	}
	pf("flows: %d from catalogs, flow:seq %d", len(p.Catalogs), p.FlowSeq)
	for _, c := range p.Catalogs {
		state := "active"
		if c.Dropped {
			state = "dropped"
		}
		line := fmt.Sprintf("  flow %d %s/%s (%s, catalog rev %d): %d windows, %d in history, %d pending, %d snapshots, %d metas listed",
			c.FlowID, c.Catalog, c.Name, state, c.Rev, len(c.Windows), len(c.History), len(c.Pending), len(c.Snapshots), len(p.Listed[c.FlowID]))
		if c.TruncatedBefore > 0 {
			line += fmt.Sprintf(", truncated before %d (%d chosen metas below it left out)", c.TruncatedBefore, p.Truncated[c.FlowID])
		}
		pf("%s", line)
	}
	for _, id := range p.Uncatalog {
		pf("  flow %d: %d metas hold its chunks but no catalog names it (it changed after its last catalog was written); listed, but without windows nothing of it restores",
			id, len(p.Listed[id]))
	}
	counts := map[Verdict]int{}
	bad := 0
	for i, m := range p.Metas {
		if m.Bad != "" {
			bad++
			continue
		}
		counts[p.Verdicts[i]]++
	}
	pf("metas: %d in the bucket: %d chosen, %d dropped, %d kept with duplicates, %d unreadable",
		len(p.Metas), counts[Chosen], counts[Dropped], counts[Kept], bad)
	for i, m := range p.Metas {
		switch {
		case m.Bad != "":
			pf("  left out %s: %s", m.Path, m.Bad)
		case p.Verdicts[i] == Dropped:
			pf("  dropped %s: every offset it holds is held by chosen metas (a fenced zombie's or a crashed cycle's)", m.Path)
		case p.Verdicts[i] == Kept:
			pf("  kept %s: it alone holds some of its offsets, so it stays although others hold the rest", m.Path)
		}
	}
	var dup int64
	for _, d := range p.Duplicates {
		dup += d.To - d.From
	}
	pf("duplicates the choice cannot avoid: %d records in %d ranges", dup, len(p.Duplicates))
	for _, d := range p.Duplicates {
		pf("  %s/%d [%d, %d) in %s and in another chosen meta: its events are listed twice; restore takes each (key, ts) once",
			d.Topic, d.Partition, d.From, d.To, p.Metas[d.Candidate].Path)
	}
	if len(p.Gaps) > 0 {
		pf("gaps: %d ranges no meta holds (cycles with neither chunks nor coverage reports upload no meta)", len(p.Gaps))
		for _, g := range p.Gaps {
			pf("  %s/%d [%d, %d)", g.Topic, g.Partition, g.From, g.To)
		}
	}
	pf("partitions:")
	for _, pp := range p.Parts {
		line := fmt.Sprintf("  %s: chain end %s, kafka committed %s -> offset %s", pp.Partition, off(pp.ChainEnd), off(pp.Kafka), off(pp.Offset))
		if pp.Offset >= 0 {
			switch st := pp.State; {
			case st == nil:
				line += ", no ckpt (no layout v2 meta of it)"
			case st.Idle:
				line += ", ckpt idle"
			case st.HasCheckpoint:
				line += fmt.Sprintf(", ckpt %d", st.Checkpoint)
			}
			if pp.State != nil {
				line += fmt.Sprintf(", %d regions", len(pp.State.Regions))
			}
			line += fmt.Sprintf(", maxts %d", pp.MaxTS)
			if pp.State == nil || pp.State.NextOffset != pp.Offset {
				line += " (the clock: no meta records the ts of the records up to the offset)"
			}
			if pp.Kafka > pp.ChainEnd {
				line += "; records below the Kafka commit and past the chain routed to no flow"
			}
		} else {
			line += ": nothing written, it starts from --start-offset"
		}
		pf("%s", line)
	}
	pf("ddl offsets:")
	for _, d := range p.DDL {
		why := "the last DDL a catalog records; later DDL are applied again (they changed no flow, or no catalog holds their change yet)"
		if d.FromEnd {
			why = "no catalog records a DDL of it: its end offset, every DDL before it taken as applied"
		}
		pf("  %s/%d: next %d (%s)", p.DDLTopic, d.Partition, d.Next, why)
	}
	pf("coverage reports of pending entries: %d", len(p.Reports))
	pf("owner: %q, written last", p.Group)
}

func off(o int64) string {
	if o < 0 {
		return "none"
	}
	return fmt.Sprint(o)
}

func tsTime(ts uint64) string {
	return event.PhysicalTime(ts).UTC().Format(time.RFC3339)
}
