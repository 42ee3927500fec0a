package event_test

import (
	"fmt"

	"github.com/flowlog/flowlog/event"
)

func ExampleDecodeBatch() {
	key := event.AppendDataKey(nil, event.RowKey(42, 7), event.ComposeTS(1646636400000, 3))
	wire := event.EncodeBatch(nil, &event.Batch{
		RegionID:   5,
		ResolvedTS: 100,
		Events:     []event.Event{{Key: key, Value: []byte("P\x01"), CF: event.CFWrite}},
	})

	var b event.Batch // reuse across records
	if err := event.DecodeBatch(&b, wire, ""); err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range b.Events {
		enc, ts, _ := event.SplitDataKey(e.Key)
		kind, table := event.Classify(enc)
		date, hour := event.DateHour(ts)
		fmt.Println(b.RegionID, e.CF, e.Op, kind, table, date, hour)
	}

	err := event.DecodeBatch(&b, []byte(`{"events":[{"cf":"CF_RAFT"}]}`), "application/json")
	fmt.Println(err.(*event.DecodeError).Reason)
	// Output:
	// 5 CF_WRITE OP_PUT table 42 20220307 07
	// json
}

func ExampleAppendDataKey() {
	raw := event.RowKey(1, 2)
	key := event.AppendDataKey(nil, raw, 431656320867237891)
	fmt.Printf("%x\n", key)

	back, ts, err := event.DecodeDataKey(key)
	fmt.Printf("%x %d %v\n", back, ts, err)
	// Output:
	// 7480000000000000ff015f728000000000ff0000020000000000fafa0272dcf9a7fffc
	// 7480000000000000015f728000000000000002 431656320867237891 <nil>
}

func ExampleDecodeWrite() {
	v, _ := event.AppendWrite(nil, event.Write{
		Type: event.WritePut, StartTS: 12345678, ShortValue: []byte("hello"), HasShortValue: true,
	})
	w, err := event.DecodeWrite(v)
	fmt.Printf("%c %d %s %v\n", w.Type, w.StartTS, w.ShortValue, err)
	// Output:
	// P 12345678 hello <nil>
}
