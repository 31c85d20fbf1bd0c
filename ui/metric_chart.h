#pragma once
// MetricChart: one Qt Charts line chart of a training metric over optimizer steps, with any
// number of named series (raw and smoothed loss; or one loss curve per compared run) and a
// linear/log y axis. Axes follow the data; points are appended as steps arrive.

#include <QChartView>
#include <QColor>
#include <QList>
#include <QPointF>
#include <QString>

class QLineSeries;
class QAbstractAxis;

namespace tandem::ui {

class MetricChart : public QChartView {
  Q_OBJECT

 public:
  MetricChart(const QString& title, const QString& y_label, QWidget* parent = nullptr);

  // Returns the series index. `width` in px; a light colour for raw data under a smoothed line.
  int addSeries(const QString& name, const QColor& color, double width = 2.0);
  void append(int series, double step, double value);
  void replace(int series, const QList<QPointF>& points);
  void clear();            // every series loses its points
  void removeAllSeries();  // and the series themselves
  void setLogScale(bool log);
  // The x axis spans at least [0, steps] (the run's length), so the curve fills it as it runs.
  void setStepSpan(double steps);
  bool logScale() const { return log_scale_; }
  int pointCount(int series) const;

 protected:
  void changeEvent(QEvent* event) override;  // follows the palette (dark/light theme)

 private:
  void rescale();
  void attachYAxis();

  QList<QLineSeries*> series_;
  QAbstractAxis* x_axis_ = nullptr;
  QAbstractAxis* y_axis_ = nullptr;
  QString y_label_;
  bool log_scale_ = false;
  double x_max_ = 1, y_min_ = 0, y_max_ = 1;
  double x_span_ = 1;
  bool has_points_ = false;
};

// A colour per series for curves that must be told apart (Okabe-Ito, readable for colour-blind
// users and on white).
QColor seriesColor(int index);

}  // namespace tandem::ui
