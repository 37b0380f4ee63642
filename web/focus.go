package web

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/store"
)

// FOCUS 1.2 (FinOps Open Cost and Usage Specification) export: one row per
// charge line, the same lines as the Allot CSV, the JSON statement and the
// finance page, so BilledCost adds up to their total to the cent.
//
// Mapping (README, "FOCUS export"):
//   - SKU = GPU type × tier (SkuId "A100-80GB/tier-3"); its price is the
//     rate card's rate × the tier's multiplier, so ListUnitPrice =
//     ContractedUnitPrice = rate × multiplier, exactly, and ListCost =
//     ContractedCost = EffectiveCost = BilledCost = the line's amount:
//     Allot has no negotiated or commitment discounts. SkuPriceId adds the
//     rate and multiplier versions.
//   - Usage lines: ChargeCategory Usage. Preemption credits: Credit.
//     Adjustments (late data for a closed month, billed in the first open
//     month): ChargeClass Correction, ChargeCategory that of what they
//     correct (Usage or Credit). Allot has no other adjustments, so
//     ChargeCategory Adjustment never appears.
//   - ChargePeriod is the usage hour; BillingPeriod the line's billing
//     month (for a correction, the month it is billed in, after the
//     closed month its ChargePeriod lies in).
//   - Quantities are GPU-hours (GPU-seconds ÷ 3600) to 6 decimals, which
//     tells every GPU-second apart; the exact GPU-seconds are in the
//     custom column x_GPUSeconds. Costs are exact (whole minor units).
//     Because each line is rounded once to the minor unit (DESIGN.md,
//     Money), ListUnitPrice × PricingQuantity matches ListCost to within
//     that rounding.
//   - Null is an empty field. Columns that do not apply (capacity
//     reservations, commitment discounts, a pricing currency other than
//     the billing currency, regions) are present and null.

// FOCUSVersion is the FOCUS version the export follows.
const FOCUSVersion = "1.2"

// FOCUSColumns is the FOCUS export's header: every FOCUS 1.2 column, in the
// specification's (alphabetical) order, then Allot's custom x_ columns.
var FOCUSColumns = []string{
	"AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingAccountType", "BillingCurrency",
	"BillingPeriodEnd", "BillingPeriodStart", "CapacityReservationId", "CapacityReservationStatus", "ChargeCategory", "ChargeClass",
	"ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "CommitmentDiscountCategory", "CommitmentDiscountId",
	"CommitmentDiscountName", "CommitmentDiscountQuantity", "CommitmentDiscountStatus", "CommitmentDiscountType", "CommitmentDiscountUnit",
	"ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "InvoiceId", "InvoiceIssuerName",
	"ListCost", "ListUnitPrice", "PricingCategory", "PricingCurrency", "PricingCurrencyContractedUnitPrice", "PricingCurrencyEffectiveCost",
	"PricingCurrencyListUnitPrice", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "RegionId", "RegionName",
	"ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "ServiceSubcategory", "SkuId", "SkuMeter",
	"SkuPriceDetails", "SkuPriceId", "SubAccountId", "SubAccountName", "SubAccountType", "Tags",
	"x_GPUSeconds", "x_CostCenter",
}

// The fixed values of the FOCUS export.
const (
	focusProvider        = "Allot"
	focusBillingAccount  = "allot"
	focusAccountName     = "Allot GPU cluster"
	focusAccountType     = "GPU Cluster"
	focusServiceName     = "Allot GPU Cluster"
	focusServiceCategory = "AI and Machine Learning"
	focusSubcategory     = "Machine Learning"
	focusResourceType    = "GPU Job"
	focusSubAccountType  = "Team"
	focusUnit            = "GPU-Hours"
	focusSkuMeter        = "GPU Usage"
	focusTagPrefix       = "allot/"
)

// focusTime writes an instant as FOCUS wants it: YYYY-MM-DDTHH:mm:ssZ.
func focusTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05Z") }

// focusHours writes GPU-seconds as GPU-hours, to 6 decimals (rounded half
// away from zero), without trailing zeros.
func focusHours(seconds int64) string {
	return trimDecimal(new(big.Rat).SetFrac64(seconds, 3600).FloatString(6))
}

// unitPrice is rate × multiplier per GPU-hour, exact: rateMicros ×
// multiplierBP / 10^10 units, written without trailing zeros.
func unitPrice(rateMicros int64, multiplierBP int) string {
	r := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(rateMicros), big.NewInt(int64(multiplierBP))), big.NewInt(10_000_000_000))
	return trimDecimal(r.FloatString(10))
}

func trimDecimal(s string) string {
	for len(s) > 1 && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}

// focusSku is the SKU of a GPU type at a tier.
func focusSku(gpuType, tier string) string { return gpuType + "/tier-" + tier }

// focusRecord is a charge line as a row of FOCUSColumns.
func focusRecord(r *store.ChargeRow) []string {
	cat := billing.CategoryOf(billing.Kind(r.Kind), billing.Kind(r.Adjusts))
	month, _ := billing.ParseMonth(r.Month)
	cost := r.Amount.Decimal()
	gpuH := focusHours(r.GPUSeconds)
	usage := cat == billing.CategoryUsage || cat == billing.CategoryUsageCorrection
	category, class := "Usage", ""
	if !usage {
		category = "Credit"
	}
	if cat.IsCorrection() {
		class = "Correction"
	}
	mult := multiplier(r.MultiplierBP)
	rate := allot.Money{Micros: r.RateMicros, Currency: r.Amount.Currency}.Decimal()
	var desc string
	switch cat {
	case billing.CategoryUsage:
		desc = fmt.Sprintf("%s GPU-hours of %s at tier %s: %s %s per GPU-hour × %s", gpuH, r.GPUType, r.Tier, rate, r.Amount.Currency, mult)
	case billing.CategoryCredit:
		desc = fmt.Sprintf("Preemption credit: %s GPU-hours of %s at tier %s lost to preemption, not charged", focusHours(-r.GPUSeconds), r.GPUType, r.Tier)
	case billing.CategoryUsageCorrection:
		desc = fmt.Sprintf("Late usage for closed month %s: %s GPU-hours of %s at tier %s: %s %s per GPU-hour × %s",
			billing.Month(r.Hour), gpuH, r.GPUType, r.Tier, rate, r.Amount.Currency, mult)
	default:
		desc = fmt.Sprintf("Correction of closed month %s's preemption credit: %s GPU-hours of %s at tier %s", billing.Month(r.Hour), gpuH, r.GPUType, r.Tier)
	}
	var quantity, unit, price, pricing string
	if usage {
		quantity, unit, price, pricing = gpuH, focusUnit, unitPrice(r.RateMicros, r.MultiplierBP), "Standard"
	}
	sku := focusSku(r.GPUType, r.Tier)
	skuPrice := sku + "/" + focusTime(r.RateFrom) + "/" + focusTime(r.MultiplierFrom)
	tags, _ := json.Marshal(map[string]string{
		focusTagPrefix + "user": r.User, focusTagPrefix + "team": r.Team, focusTagPrefix + "cost_center": r.CostCenter,
		focusTagPrefix + "tier": r.Tier, focusTagPrefix + "gpu_type": r.GPUType, focusTagPrefix + "job_name": r.JobName,
	})
	return []string{
		"",                               // AvailabilityZone
		cost,                             // BilledCost
		focusBillingAccount,              // BillingAccountId
		focusAccountName,                 // BillingAccountName
		focusAccountType,                 // BillingAccountType
		r.Amount.Currency,                // BillingCurrency
		focusTime(month.End()),           // BillingPeriodEnd
		focusTime(month.Start()),         // BillingPeriodStart
		"",                               // CapacityReservationId
		"",                               // CapacityReservationStatus
		category,                         // ChargeCategory
		class,                            // ChargeClass
		desc,                             // ChargeDescription
		"Usage-Based",                    // ChargeFrequency
		focusTime(r.Hour.Add(time.Hour)), // ChargePeriodEnd
		focusTime(r.Hour),                // ChargePeriodStart
		"", "", "", "", "", "", "",       // CommitmentDiscount{Category,Id,Name,Quantity,Status,Type,Unit}
		quantity,       // ConsumedQuantity
		unit,           // ConsumedUnit
		cost,           // ContractedCost
		price,          // ContractedUnitPrice
		cost,           // EffectiveCost
		"",             // InvoiceId
		focusProvider,  // InvoiceIssuerName
		cost,           // ListCost
		price,          // ListUnitPrice
		pricing,        // PricingCategory
		"", "", "", "", // PricingCurrency, PricingCurrency{ContractedUnitPrice,EffectiveCost,ListUnitPrice}
		quantity,      // PricingQuantity
		unit,          // PricingUnit
		focusProvider, // ProviderName
		focusProvider, // PublisherName
		"", "",        // RegionId, RegionName
		strconv.FormatInt(r.JobID, 10),      // ResourceId
		csvText(r.JobName),                  // ResourceName
		focusResourceType,                   // ResourceType
		focusServiceCategory,                // ServiceCategory
		focusServiceName,                    // ServiceName
		focusSubcategory,                    // ServiceSubcategory
		sku,                                 // SkuId
		focusSkuMeter,                       // SkuMeter
		"",                                  // SkuPriceDetails
		skuPrice,                            // SkuPriceId
		r.Team,                              // SubAccountId
		csvText(r.TeamName),                 // SubAccountName
		focusSubAccountType,                 // SubAccountType
		csvText(string(tags)),               // Tags
		strconv.FormatInt(r.GPUSeconds, 10), // x_GPUSeconds
		csvText(r.CostCenter),               // x_CostCenter
	}
}
