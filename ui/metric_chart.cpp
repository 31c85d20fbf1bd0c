#include "ui/metric_chart.h"

#include <QEvent>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "ui/theme.h"

namespace tandem::ui {

QColor seriesColor(int index) {
  static const QColor kColors[] = {QColor(0, 114, 178),   QColor(213, 94, 0),   QColor(0, 158, 115),
                                   QColor(204, 121, 167), QColor(86, 180, 233), QColor(230, 159, 0),
                                   QColor(0, 0, 0)};
  return kColors[index % static_cast<int>(std::size(kColors))];
}

MetricChart::MetricChart(const QString& title, const QString& y_label, QWidget* parent)
    : QChartView(parent), y_label_(y_label) {
  auto* chart = new QChart();
  chart->setTitle(title);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->legend()->setVisible(false);
  chart->setMargins(QMargins(4, 4, 4, 4));
  setChart(chart);  // the view owns the chart
  setRenderHint(QPainter::Antialiasing);
  setMinimumSize(260, 150);
  auto* x = new QValueAxis();
  x->setTitleText(tr("step"));
  x->setLabelFormat("%d");
  chart->addAxis(x, Qt::AlignBottom);
  x_axis_ = x;
  attachYAxis();
}

void MetricChart::attachYAxis() {
  if (y_axis_) {
    for (QLineSeries* s : series_) s->detachAxis(y_axis_);
    chart()->removeAxis(y_axis_);
    delete y_axis_;
  }
  if (log_scale_) {
    auto* y = new QLogValueAxis();
    y->setBase(10);
    y->setLabelFormat("%.3g");
    y->setMinorTickCount(-1);
    y_axis_ = y;
  } else {
    auto* y = new QValueAxis();
    y->setLabelFormat("%.4g");
    y_axis_ = y;
  }
  y_axis_->setTitleText(y_label_);
  chart()->addAxis(y_axis_, Qt::AlignLeft);
  for (QLineSeries* s : series_) s->attachAxis(y_axis_);
  applyChartPalette(chart(), palette());
  rescale();
}

void MetricChart::changeEvent(QEvent* event) {
  QChartView::changeEvent(event);
  if (event->type() == QEvent::PaletteChange) applyChartPalette(chart(), palette());
}

int MetricChart::addSeries(const QString& name, const QColor& color, double width) {
  auto* s = new QLineSeries();
  s->setName(name);
  QPen pen(color);
  pen.setWidthF(width);
  s->setPen(pen);
  chart()->addSeries(s);
  s->attachAxis(x_axis_);
  s->attachAxis(y_axis_);
  series_.append(s);
  chart()->legend()->setVisible(series_.size() > 1);
  return static_cast<int>(series_.size()) - 1;
}

void MetricChart::append(int series, double step, double value) {
  if (!std::isfinite(value)) return;  // a diverged step has no place on the axis
  series_[series]->append(step, value);
  x_max_ = has_points_ ? std::max(x_max_, step) : step;
  y_min_ = has_points_ ? std::min(y_min_, value) : value;
  y_max_ = has_points_ ? std::max(y_max_, value) : value;
  has_points_ = true;
  rescale();
}

void MetricChart::replace(int series, const QList<QPointF>& points) {
  QList<QPointF> finite;
  finite.reserve(points.size());
  for (const QPointF& p : points) {
    if (!std::isfinite(p.y())) continue;
    finite.append(p);
    x_max_ = has_points_ ? std::max(x_max_, p.x()) : p.x();
    y_min_ = has_points_ ? std::min(y_min_, p.y()) : p.y();
    y_max_ = has_points_ ? std::max(y_max_, p.y()) : p.y();
    has_points_ = true;
  }
  series_[series]->replace(finite);
  rescale();
}

void MetricChart::clear() {
  for (QLineSeries* s : series_) s->clear();
  has_points_ = false;
  x_max_ = 1;
  y_min_ = 0;
  y_max_ = 1;
  rescale();
}

void MetricChart::removeAllSeries() {
  chart()->removeAllSeries();  // deletes them
  series_.clear();
  clear();
}

int MetricChart::pointCount(int series) const { return static_cast<int>(series_[series]->count()); }

void MetricChart::setStepSpan(double steps) {
  if (steps == x_span_) return;
  x_span_ = steps;
  rescale();
}

void MetricChart::setLogScale(bool log) {
  if (log == log_scale_) return;
  log_scale_ = log;
  attachYAxis();
}

void MetricChart::rescale() {
  auto* x = static_cast<QValueAxis*>(x_axis_);
  x->setRange(0, std::max({1.0, x_max_, x_span_}));
  x->applyNiceNumbers();  // ticks on round steps
  double lo = y_min_, hi = y_max_;
  if (log_scale_) {
    // A log axis needs positive bounds; decades that hold the data.
    lo = std::pow(10.0, std::floor(std::log10(std::max(lo, 1e-12))));
    hi = std::pow(10.0, std::ceil(std::log10(std::max(hi, lo * 10))));
  } else {
    const double pad = hi > lo ? (hi - lo) * 0.05 : std::max(std::abs(hi) * 0.05, 1e-9);
    lo -= pad;
    hi += pad;
    if (y_min_ >= 0 && lo < 0) lo = 0;
  }
  y_axis_->setRange(lo, hi);
  if (!log_scale_) static_cast<QValueAxis*>(y_axis_)->applyNiceNumbers();
}

}  // namespace tandem::ui
