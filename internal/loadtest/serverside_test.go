package loadtest

import (
	"math"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

func histFamily(route string, bounds []float64, cum []uint64, total uint64) *dto.MetricFamily {
	h := &dto.Histogram{SampleCount: proto.Uint64(total)}
	for i, b := range bounds {
		h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: proto.Float64(b), CumulativeCount: proto.Uint64(cum[i])})
	}
	h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: proto.Float64(math.Inf(1)), CumulativeCount: proto.Uint64(total)})
	return &dto.MetricFamily{Name: proto.String("allot_http_request_duration_seconds"), Type: dto.MetricType_HISTOGRAM.Enum(),
		Metric: []*dto.Metric{{Label: []*dto.LabelPair{{Name: proto.String("route"), Value: proto.String(route)},
			{Name: proto.String("method"), Value: proto.String("POST")}}, Histogram: h}}}
}

// TestServerOpsIn: the window's server-side figures are the difference of
// two readings, with quantiles interpolated inside buckets as
// histogram_quantile does, and what passed the largest bucket counted.
func TestServerOpsIn(t *testing.T) {
	bounds := []float64{0.01, 0.1, 1}
	before := serverTimesOf([]*dto.MetricFamily{histFamily("/api/agent/v1/heartbeat", bounds, []uint64{50, 50, 50}, 50)})
	// In the window: 100 heartbeats, 90 under 10 ms, 8 in 10-100 ms, 1
	// in 100 ms-1 s, 1 over 1 s.
	after := serverTimesOf([]*dto.MetricFamily{
		histFamily("/api/agent/v1/heartbeat", bounds, []uint64{140, 148, 149}, 150),
		histFamily("/api/v1/teams", bounds, []uint64{5, 5, 5}, 5), // not the load's
	})
	ops := serverOpsIn(before, after)
	if len(ops) != 1 {
		t.Fatalf("ops %+v, want the heartbeat only", ops)
	}
	o := ops[0]
	// p50: rank 50 of 90 in [0, 10 ms) → 5.6 ms; p99: rank 99, the 1st of
	// the one in [100 ms, 1 s) → 1 s.
	if o.Route != "POST /api/agent/v1/heartbeat" || o.Count != 100 || o.P50 != 5.6 || o.P99 != 1000 || o.Over != 1 {
		t.Errorf("got %+v", o)
	}
}

// TestAdmissionWaitIn: admission control's wait per level is reported
// beside the routes, keyed by level.
func TestAdmissionWaitIn(t *testing.T) {
	f := histFamily("", []float64{0.01, 0.1}, []uint64{9, 10}, 10)
	f.Name = proto.String("allot_admission_wait_seconds")
	f.Metric[0].Label = []*dto.LabelPair{{Name: proto.String("level"), Value: proto.String("heartbeat")}}
	ops := serverOpsIn(nil, serverTimesOf([]*dto.MetricFamily{f}))
	if len(ops) != 1 || ops[0].Route != "admission wait: heartbeat" || ops[0].Count != 10 || ops[0].P99 <= 10 {
		t.Errorf("got %+v", ops)
	}
}
